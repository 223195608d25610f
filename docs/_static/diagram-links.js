// A diagram is drawn at its own size, never shrunk (custom.css); one wider than its box, on a
// phone, scrolls sideways inside it. Under such a diagram, a link opens the picture on its own,
// where the browser can zoom and pan it.
window.addEventListener("load", () => {
  for (const box of document.querySelectorAll("article div.graphviz")) {
    const picture = box.querySelector("object[data], img[src]");
    if (!picture || box.scrollWidth <= box.clientWidth + 1) continue;
    const link = document.createElement("a");
    link.href = picture.getAttribute("data") || picture.getAttribute("src");
    link.textContent = "Open the diagram on its own";
    const note = document.createElement("p");
    note.className = "graphviz-open";
    note.append("Wider than the screen: scroll it sideways, or ", link, ".");
    box.after(note);
  }
});
