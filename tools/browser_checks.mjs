// What a new user sees of the pack in ComfyUI's own frontend (headless Chromium, playwright-core, the system's
// chromium), saved as screenshots with what each shows, as JSON on the last line. Started by tools/browser_checks.py,
// which starts ComfyUI (the pack linked, no model files); only loopback addresses.
//
//   node tools/browser_checks.mjs <job.json>
// job: {url, chromium, profile, pack, first_run, real, out, tag}
// 1. templates_<tag>.png: the template browser on the pack's category; the order its titles show in.
// 2. first_run_canvas_<tag>.png: the first-run workflow at 100% with the node-source badges as a new user has them:
//    the Note, the group titles, the node titles.
// 3. missing_models_<tag>.png: the real workflow opened from the template route with no model files: the files the
//    frontend lists as missing (1.27: a dialog; 1.49: the errors panel) and whether it offers their downloads.

import fs from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(process.env.PLAYWRIGHT_CORE_DIR + "/");
const { chromium } = require("playwright-core");

const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const result = { tag: job.tag };

const browser = await chromium.launchPersistentContext(job.profile, {
  executablePath: job.chromium, headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"],
  viewport: { width: 1600, height: 1000 }, deviceScaleFactor: 1,
});
const page = browser.pages()[0] || (await browser.newPage());
const boot = async () => {
  await page.goto(job.url, { waitUntil: "load" });
  await page.waitForFunction(() => !!(window.app && window.app.graph && window.app.canvas), null, { timeout: 120000 });
  await sleep(3000);
  await page.keyboard.press("Escape");
  await sleep(300);
};
const template = (name) => `/api/workflow_templates/${job.pack}/${encodeURIComponent(name)}.json`;
const openTemplate = async (name) => {
  await page.evaluate(async ({ url, name }) => {
    const wf = await (await fetch(url)).json();
    await window.app.loadGraphData(wf, true, true, name);
  }, { url: template(name), name });
  await sleep(3000);
};

try {
  // 1. The template browser: its Templates button (the side bar), then the pack's category.
  await boot();
  await page.getByText("Templates", { exact: true }).first().click();
  await sleep(3000);
  await page.getByText(job.pack, { exact: true }).first().click();
  await sleep(3000);
  const text = await page.evaluate(() => document.body.innerText);
  const names = job.names.filter((n) => text.includes(n));
  result.templates_shown = names.sort((a, b) => text.indexOf(a) - text.indexOf(b));
  await page.screenshot({ path: `${job.out}/templates_${job.tag}.png` });
  await page.keyboard.press("Escape");

  // 2. The first-run workflow at 100%, its top-left: the Note, the first groups, badges on.
  await boot();
  await openTemplate(job.first_run);
  for (let i = 0; i < 3; i++) {  // 1.27 fits the view to a loaded graph a moment later: set it again
    await page.evaluate(() => {
      for (const b of document.querySelectorAll(".p-toast-close-button, .p-dialog-close-button")) b.click();
      const c = window.app.canvas;
      c.ds.scale = 1; c.ds.offset[0] = 60; c.ds.offset[1] = 40; c.setDirty(true, true);
    });
    await sleep(1000);
  }
  result.badge_mode = await page.evaluate(() => window.app.extensionManager?.setting?.get?.("Comfy.NodeBadge.NodeSourceBadgeMode") ?? null);
  await page.screenshot({ path: `${job.out}/first_run_canvas_${job.tag}.png` });
  // 3. The real (last: 1.49 keeps its errors panel open) workflow without its files: what the frontend offers.
  await boot();
  await openTemplate(job.real);
  const details = page.getByText("View details");  // 1.49: "N errors found" -> the errors panel
  if (await details.count()) { await details.first().click(); await sleep(2000); }
  const shown = await page.evaluate(() => document.body.innerText);
  result.missing_listed = job.files.filter((f) => shown.includes(f));
  result.download_offered = /Download/.test(shown);
  await page.screenshot({ path: `${job.out}/missing_models_${job.tag}.png` });

} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
