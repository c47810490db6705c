// One node's help page in ComfyUI's own frontend (headless Chromium, playwright-core, the system's chromium): the
// node library's search finds the node, a click on it adds it to an empty canvas, the selection toolbox's Node Info
// button opens the documentation panel, which the frontend fills from /extensions/<pack>/docs/<NodeName>.md
// (web/docs, tools/build_docs.py). Saves a screenshot and prints, as JSON on the last line, the help URLs the page
// asked for, how the node was added and the panel's text. Started by tests/host/test_host_node_docs.py (ComfyUI
// running, the pack linked); only loopback addresses.
//
//   node tools/node_help.mjs <job.json>
// job: {url, chromium, profile, node, title, out}

import fs from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(process.env.PLAYWRIGHT_CORE_DIR + "/");
const { chromium } = require("playwright-core");

const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const result = { fetched: [], added_by: null };

const browser = await chromium.launchPersistentContext(job.profile, {
  executablePath: job.chromium, headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"],
  viewport: { width: 1600, height: 1000 }, deviceScaleFactor: 1,
});
const page = browser.pages()[0] || (await browser.newPage());
page.on("request", (r) => {
  const path = new URL(r.url()).pathname;
  if (path.includes("/docs/")) result.fetched.push(decodeURIComponent(path));
});
try {
  await page.goto(job.url, { waitUntil: "load" });
  await page.waitForFunction(() => !!(window.app && window.app.graph && window.app.canvas), null, { timeout: 120000 });
  await sleep(3000);
  await page.keyboard.press("Escape");
  await page.evaluate(() => { window.app.graph.clear(); window.app.canvas.setDirty(true, true); });

  // The node library (its side-bar button), searched for the node's title; a click on the entry adds the node.
  await page.getByLabel(/^Node Library/).first().click();
  await sleep(1500);
  await page.getByPlaceholder(/^Search/).first().fill(job.title);  // 1.49: "Search...", 1.27: "Search Nodes..."
  await sleep(2000);
  const entry = page.getByRole("treeitem").filter({ hasText: job.title }).first();
  const count = () => page.evaluate((type) => window.app.graph._nodes.filter((n) => n.type === type).length, job.node);
  if (await entry.count()) {
    await entry.click();
    for (let i = 0; i < 8 && !(await count()); i++) await sleep(250);
    if (!(await count())) {  // 1.49: the click picks the node up; a click on the canvas puts it down there
      await page.mouse.click(800, 450);
      for (let i = 0; i < 8 && !(await count()); i++) await sleep(250);
    }
  }
  if (await count()) {
    result.added_by = "node library";
  } else {  // the entry did not add it (another frontend's library): add it as the canvas' search would
    await page.evaluate((type) => { const n = LiteGraph.createNode(type); n.pos = [500, 250]; window.app.graph.add(n); },
                        job.node);
    result.added_by = "script";
  }
  await page.getByLabel(/^Node Library/).first().click();  // close the library again
  await sleep(800);
  // Select it: the selection toolbox shows over it, with the Node Info button.
  await page.evaluate((type) => {
    const n = window.app.graph._nodes.find((x) => x.type === type);
    n.pos = [500, 250];
    const c = window.app.canvas;
    c.ds.scale = 1; c.ds.offset[0] = 0; c.ds.offset[1] = 0;
    c.deselectAll?.();
    c.selectNode(n);
    c.setDirty(true, true);
  }, job.node);
  await sleep(1500);
  // The selection toolbox's info button (1.49: labelled Node Info, opens the properties panel's Info tab; 1.27: the
  // info-button, opens the help page in the node library)
  await page.getByLabel("Node Info").or(page.getByTestId("info-button")).first().click();
  await sleep(3000);
  result.panel = await page.evaluate((title) => {
    const h = [...document.querySelectorAll("h1")].find((e) => e.textContent.trim() === title);
    return h ? h.parentElement.innerText : "";
  }, job.title);
  result.nodes_in_graph = await page.evaluate(() => window.app.graph._nodes.map((n) => n.type));
  await page.screenshot({ path: job.out });
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
