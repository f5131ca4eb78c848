// Renders every plot of a `dvc plots show` page with the JavaScript inlined in the page's
// template, in Node, the way the page's own scripts do in a browser: vegaEmbed on a div.
// Node has no DOM, so a stub stands in for the few element and event calls vega-embed makes;
// with renderer "none" nothing is drawn into it, and each view is then exported to SVG.
// Usage: node render_plots.js BUNDLE.js SPECS.json  ->  [paths in each plot's SVG, ...]
const fs = require("fs");

function element(tag) {
  return {
    tagName: tag, children: [], style: {}, attributes: {},
    classList: { add() {}, remove() {}, contains: () => false },
    appendChild(child) { this.children.push(child); return child; },
    insertBefore(child) { this.children.push(child); return child; },
    removeChild() {}, setAttribute(k, v) { this.attributes[k] = v; },
    getAttribute(k) { return this.attributes[k]; }, removeAttribute() {},
    addEventListener() {}, removeEventListener() {}, querySelector: () => null,
    getBoundingClientRect: () => ({ left: 0, top: 0, width: 300, height: 300 }),
    get firstChild() { return this.children[0] || null; },
    get childNodes() { return this.children; },
  };
}

globalThis.window = globalThis;
globalThis.ShadowRoot = class ShadowRoot {};
globalThis.HTMLElement = class HTMLElement {};
globalThis.addEventListener = globalThis.removeEventListener = () => {};
globalThis.document = {
  createElement: element, createElementNS: (ns, tag) => element(tag),
  querySelector: () => element("div"), getElementById: () => null,
  head: element("head"), body: element("body"),
  addEventListener() {}, removeEventListener() {},
};
(0, eval)(fs.readFileSync(process.argv[2], "utf8"));

(async () => {
  const paths = [];
  for (const spec of JSON.parse(fs.readFileSync(process.argv[3], "utf8"))) {
    const { view } = await window.vegaEmbed(element("div"), spec, { renderer: "none", actions: false });
    paths.push(((await view.toSVG()).match(/<path/g) || []).length);
  }
  console.log(JSON.stringify(paths));
})().catch((error) => { console.error(error); process.exit(1); });
