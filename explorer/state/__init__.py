"""What requests share: sessions and their models, checkpoints, the result cache, locks, threads, text in."""
