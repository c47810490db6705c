// Drives ComfyUI's own frontend in headless Chromium (playwright-core, the system's chromium; no browser
// is downloaded): loads a UI-format workflow, sets widgets by node type and widget name, fits the view to
// the graph, screenshots the canvas, queues the workflow from the page, waits until it has run, and
// screenshots again. Started by tools/screenshots.py, which starts ComfyUI; only loopback addresses.
//
//   node tools/screenshots.mjs <job.json>
// job: {url, chromium, profile, workflow (UI JSON), overrides: {node type: {widget: value}},
//       before, after (PNG paths), width, height, timeout_s}

import fs from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(process.env.PLAYWRIGHT_CORE_DIR + "/");
const { chromium } = require("playwright-core");

const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const browser = await chromium.launchPersistentContext(job.profile, {
  executablePath: job.chromium,
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"],
  viewport: { width: job.width, height: job.height },
  deviceScaleFactor: 1,
});
let failed = null;
try {
  const page = browser.pages()[0] || (await browser.newPage());
  page.on("pageerror", (e) => console.error("page error:", e.message));
  await page.goto(job.url, { waitUntil: "load" });
  await page.waitForFunction(() => !!(window.app && window.app.graph && window.LiteGraph && window.app.canvas),
                             null, { timeout: 120000 });
  await sleep(2000); // the frontend finishes its extensions and first draw
  await page.keyboard.press("Escape"); // any first-start dialog

  const closeDialogs = async () => {
    for (let i = 0; i < 3; i++) {
      const closed = await page.evaluate(() => {
        const buttons = [...document.querySelectorAll(".p-dialog-close-button, .p-dialog-header-close")];
        for (const b of buttons) b.click();
        return buttons.length;
      });
      if (!closed) break;
      await sleep(500);
    }
  };

  // Load the workflow and apply the overrides; fail on a widget that is not there.
  const missing = await page.evaluate(async ({ workflow, overrides, title }) => {
    await window.app.loadGraphData(workflow, true, true, title);
    const missing = [];
    for (const [type, values] of Object.entries(overrides)) {
      const nodes = window.app.graph._nodes.filter((n) => n.type === type);
      for (const node of nodes) {
        for (const [name, value] of Object.entries(values)) {
          const w = (node.widgets || []).find((w) => w.name === name);
          if (!w) { missing.push(`${type}.${name}`); continue; }
          w.value = value;
          if (w.callback) w.callback(value, window.app.canvas, node);
        }
      }
    }
    // Load it again as changed, so the frontend checks the new values (e.g. model files present).
    await window.app.loadGraphData(window.app.graph.serialize(), true, true, title);
    // Close the empty default workflow's tab, if this frontend has tabs: only the workflow's tab shows.
    try {
      const store = window.app.extensionManager && window.app.extensionManager.workflow;
      for (const w of [...(store.openWorkflows || [])]) if (w !== store.activeWorkflow) await store.closeWorkflow(w);
    } catch (e) { console.log("tabs left as they are:", e.message); }
    return missing;
  }, { workflow: job.workflow, overrides: job.overrides, title: job.title });
  if (missing.length) console.error("widgets not in this workflow (left as they are):", missing.join(", "));
  // The first load offers the real model files the workflow names (its loader's properties.models) where they are
  // not in the model folders: a dialog over the canvas. The second load names the tiny files; close the dialog.
  await closeDialogs();
  await page.mouse.click(5, job.height - 5); // drop any widget focus without touching a node

  // Fit the view to all nodes and groups (or to the boxes `frame` picks: [x, y, w, h] in graph units), inside the
  // part of the canvas no menu or side bar covers (or inside `area`: {left, top, right, bottom} in page pixels).
  const fit = async (frame = null, area = null) => {
    await page.evaluate(({ frame, area }) => {
      const c = window.app.canvas;
      const el = c.canvas;
      const rect = el.getBoundingClientRect();
      // What covers the canvas: the top menu and side bars (new menu); measured, not assumed.
      let top = rect.top, left = rect.left, right = rect.right, bottom = rect.bottom;
      for (const sel of [".comfyui-menu", ".comfy-menu-bar", ".workflow-tabs-container", ".actionbar",
                         ".side-tool-bar-container", ".comfyui-body-top", ".comfyui-body-left"]) {
        for (const e of document.querySelectorAll(sel)) {
          const r = e.getBoundingClientRect();
          if (!r.width || !r.height) continue;
          if (r.width > rect.width * 0.5 && r.top <= top + 5) top = Math.max(top, r.bottom);
          else if (r.height > rect.height * 0.5 && r.left <= left + 5) left = Math.max(left, r.right);
        }
      }
      if (area) ({ left, top, right, bottom } = area);
      let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
      const add = (x, y, w, h) => { x0 = Math.min(x0, x); y0 = Math.min(y0, y); x1 = Math.max(x1, x + w); y1 = Math.max(y1, y + h); };
      const titleH = window.LiteGraph.NODE_TITLE_HEIGHT || 30;
      if (frame) {
        for (const b of frame) add(b[0], b[1], b[2], b[3]);
      } else {
        for (const n of window.app.graph._nodes) add(n.pos[0], n.pos[1] - titleH, n.size[0], n.size[1] + titleH);
        for (const g of window.app.graph._groups || []) {
          const b = g._bounding || g.bounding || [g.pos[0], g.pos[1], g.size[0], g.size[1]];
          add(b[0], b[1], b[2], b[3]);
        }
      }
      const pad = 24;
      const W = right - left - 2 * pad, H = bottom - top - 2 * pad;
      const scale = Math.min(W / (x1 - x0), H / (y1 - y0), 1.5);
      const ds = c.ds;
      ds.scale = scale;
      // screen = (graph + offset) * scale, relative to the canvas element
      ds.offset[0] = (left - rect.left + pad + (W - (x1 - x0) * scale) / 2) / scale - x0;
      ds.offset[1] = (top - rect.top + pad + (H - (y1 - y0) * scale) / 2) / scale - y0;
      c.setDirty(true, true);
    }, { frame, area });
    await sleep(800);
  };
  // Toasts (messages of the host) are printed here and closed: they would cover the graph.
  const toasts = async () => {
    const texts = await page.evaluate(() => {
      const out = [...document.querySelectorAll(".p-toast-message")].map((e) => e.innerText.replace(/\s+/g, " "));
      for (const b of document.querySelectorAll(".p-toast-close-button")) b.click();
      return out;
    });
    for (const t of texts) console.log("toast:", t);
    await sleep(500);
  };
  await fit();
  await toasts();
  await page.screenshot({ path: job.before });
  console.log("saved", job.before);

  // Queue from the page, as the Run button does, and wait until the queue is empty again.
  const promptId = await page.evaluate(async () => {
    const before = Object.keys(await (await fetch("/api/history")).json());
    await window.app.queuePrompt(0, 1);
    for (let i = 0; i < 100; i++) {
      const now = Object.keys(await (await fetch("/api/history")).json()).filter((k) => !before.includes(k));
      const q = await (await fetch("/api/queue")).json();
      const ids = [...q.queue_running, ...q.queue_pending].map((e) => e[1]);
      if (ids.length || now.length) return ids[0] || now[0];
      await new Promise((r) => setTimeout(r, 300));
    }
    return null;
  });
  if (!promptId) throw new Error("queueing from the page did not start a prompt (see the before screenshot)");
  console.log("queued", promptId);
  const deadline = Date.now() + job.timeout_s * 1000;
  let entry = null;
  while (Date.now() < deadline) {
    entry = await page.evaluate(async (id) => (await (await fetch(`/api/history/${id}`)).json())[id], promptId);
    if (entry && entry.status && entry.status.completed !== undefined) break;
    entry = null;
    await sleep(1000);
  }
  if (!entry) throw new Error(`prompt ${promptId} did not finish in ${job.timeout_s} s`);
  console.log("status", entry.status.status_str);
  if (entry.status.status_str !== "success") failed = JSON.stringify(entry.status).slice(-3000);
  await sleep(2500); // images arrive over the websocket and are drawn on their nodes
  await page.keyboard.press("Escape"); // an error dialog, if any, would cover the canvas
  await fit(); // nodes that show images grew
  await toasts();
  await page.screenshot({ path: job.after });
  console.log("saved", job.after);
  if (job.thumbnail) {
    // The template browser's picture: Train Steps (its live preview and loss) and the Looking group, square.
    const frame = await page.evaluate(() => {
      const titleH = window.LiteGraph.NODE_TITLE_HEIGHT || 30;
      const boxes = window.app.graph._nodes.filter((n) => n.type === "QwenLoRATrain")
        .map((n) => [n.pos[0], n.pos[1] - titleH, n.size[0], n.size[1] + titleH]);
      for (const g of window.app.graph._groups || []) {
        if (!/^5\./.test(g.title)) continue;
        const b = g._bounding || g.bounding || [g.pos[0], g.pos[1], g.size[0], g.size[1]];
        boxes.push([b[0], b[1], b[2], b[3]]);
      }
      return boxes;
    });
    const rect = await page.evaluate(() => {
      const r = window.app.canvas.canvas.getBoundingClientRect();
      return { left: r.left, top: r.top, right: r.right, bottom: r.bottom };
    });
    // A square in the middle of the page: clear of the menus, side bars and the canvas' corner controls.
    const side = Math.round(Math.min(rect.right - rect.left, rect.bottom - rect.top) - 160);
    const cx = (rect.left + rect.right) / 2, cy = (rect.top + rect.bottom) / 2;
    const area = { left: Math.round(cx - side / 2), top: Math.round(cy - side / 2) };
    area.right = area.left + side; area.bottom = area.top + side;
    await fit(frame, area);
    await page.screenshot({ path: job.thumbnail, clip: { x: area.left, y: area.top, width: side, height: side } });
    console.log("saved", job.thumbnail);
  }
} catch (e) {
  // What the page showed when it went wrong (validation errors, dialogs), for the one who reruns it.
  const shot = job.after.replace(/\.png$/, "_failed.png");
  try { await browser.pages()[0].screenshot({ path: shot }); console.error("saved", shot); } catch {}
  throw e;
} finally {
  await browser.close();
}
if (failed) {
  console.error("the workflow did not run through:", failed);
  process.exit(3);
}
