// On page load: ?join=... shows the vote view alone and joins the room in the link (?join= alone: type the code).
() => {
  const code = new URLSearchParams(window.location.search).get('join');
  if (code === null) return;
  document.body.classList.add('joining');
  if (!code) return;
  const go = (n) => { const b = document.getElementById('join-go'); if (b) b.click(); else if (n) setTimeout(() => go(n - 1), 100); };
  setTimeout(() => go(50), 50);
}
