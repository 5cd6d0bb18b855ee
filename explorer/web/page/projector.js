// The header's projector switch: the page's larger text on or off, every figure drawn again at the new sizes.
(on) => {
  if (!on && window.explorerUnpresent) window.explorerUnpresent();
  document.body.classList.toggle('projector', !!on);
  if (window.explorerRestyle) window.explorerRestyle();
  window.dispatchEvent(new Event('resize'));
  if (window.explorerFit) setTimeout(window.explorerFit, 200);
}
