// The Join button sends the typed code, or the link's when nothing is typed.
(code, v) => [code || new URLSearchParams(window.location.search).get('join') || '', v]
