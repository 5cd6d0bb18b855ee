"""The web side of the app: serving and the queue, HTTP middleware, links, opening examples, the sweeper."""
