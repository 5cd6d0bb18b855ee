// After a model load ends (loaded or refused): the loading line goes away.
() => { if (window.explorerLoaded) window.explorerLoaded(); }
