// The Ask button sends the page's own address (the join link is built from it) as its last input.
(...a) => [...a.slice(0, -1), window.location.origin + window.location.pathname]
