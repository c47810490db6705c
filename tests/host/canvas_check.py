"""Loads a UI-format workflow into the real ComfyUI frontend in headless Chromium and prints what the
canvas makes of it: the API prompt it would queue (app.graphToPrompt), any missing node types, and each
node's position, size and the least size the canvas computes for it (LGraphNode.computeSize), and the nodes
each group holds by the canvas' own rule (LGraphGroup.recomputeInsideNodes), the room each node's title has
(negative: the canvas cuts it), each Note's text box height against the height its lines need, and the page's
uncaught exceptions (while it booted, and while it loaded the workflow).

Run by test_host_comfyui.py with a Python that has aiohttp (ComfyUI's own):
    python canvas_check.py <comfyui url> <template path under /api/workflow_templates/> <chromium>
Speaks the Chrome DevTools Protocol over a websocket; only loopback addresses are used.
"""

import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request

import aiohttp

SCRIPT = """
(async () => {
  const url = %s;
  const wf = await (await fetch(url)).json();
  // As the template browser opens it: in a workflow (tab) named after the file (1.27 draws no Note's text box in a
  // graph loaded without one).
  await window.app.loadGraphData(wf, true, true, decodeURIComponent(url.split("/").pop()).replace(/\.json$/, ""));
  const nodes = window.app.graph._nodes.map(n => ({id: n.id, type: n.type, missing: !LiteGraph.registered_node_types[n.type],
                                                   widgets: (n.widgets || []).map(w => [w.name, w.value]),
                                                   pos: Array.from(n.pos), size: Array.from(n.size),
                                                   least: Array.from(n.computeSize())}));
  // Group membership reads each node's bounding rect, which frontends before 1.28 (ComfyUI 0.3.64 pins 1.27.10)
  // compute only when the canvas draws the node: compute it as the first draw does, else every group is empty.
  for (const n of window.app.graph._nodes) n.updateArea?.();
  const groups = window.app.graph._groups.map(g => { g.recomputeInsideNodes();  // the canvas' own membership rule
                                                      return {title: g.title, nodes: g.nodes.map(n => n.id)}; });
  const prompt = await window.app.graphToPrompt();
  // Each title as the canvas draws it (its title font, within the node's width less two title-bar heights and its
  // title buttons): room left over, negative where the canvas cuts it with an ellipsis.
  const ctx = window.app.canvas.ctx;
  const titles = window.app.graph._nodes.map(n => {
    ctx.save();
    ctx.font = n.titleFontStyle || `${LiteGraph.NODE_TEXT_SIZE}px ${LiteGraph.NODE_FONT}`;
    let room = n.size[0] - 2 * LiteGraph.NODE_TITLE_HEIGHT;
    for (const b of n.title_buttons || []) if (b.visible) room -= b.getWidth(ctx) + 2;
    const width = ctx.measureText(n.getTitle ? n.getTitle() : n.title).width;
    ctx.restore();
    return {id: n.id, title: n.getTitle ? n.getTitle() : n.title, room: room - width};
  });
  // Each Note's text box, drawn at scale 1 in view: the height its lines need (scrollHeight) against its own.
  const c = window.app.canvas;
  const notes = [];
  for (const n of window.app.graph._nodes.filter(n => n.type === "Note")) {
    const w = (n.widgets || [])[0];
    const el = w && (w.element || w.inputEl);
    const box = el && (el.tagName === "TEXTAREA" ? el : el.querySelector("textarea"));
    // The frontend shows a text box once the canvas has drawn its node in view at a readable scale (a few frames);
    // 1.27 fits the view to a loaded graph a moment later, so the view is set again until the box shows.
    // The box is read once it has kept one height over three reads (it grows to its node over a few frames).
    const heights = [];
    for (let i = 0; i < 60; i++) {
      c.ds.scale = 1; c.ds.offset[0] = 20 - n.pos[0]; c.ds.offset[1] = 60 - n.pos[1]; c.setDirty(true, true);
      await new Promise(r => setTimeout(r, 200));
      heights.push(box ? box.clientHeight : 0);
      const last = heights.slice(-3);
      if (i >= 3 && last[0] > 4 && last.every(h => h === last[0])) break;
    }
    notes.push({id: n.id, client: box ? box.clientHeight : null, scroll: box ? box.scrollHeight : null,
                font: box ? getComputedStyle(box).font : null});
  }
  return JSON.stringify({nodes, groups, titles, notes, output: prompt.output});
})()
"""


async def main(url: str, template: str, chromium: str) -> None:
    port = 9300 + int(time.time()) % 500
    profile = tempfile.mkdtemp()
    browser = subprocess.Popen([
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--window-size=1920,1080",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", f"--remote-debugging-port={port}", "about:blank",
    ], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=2).read())
                page = next(t for t in targets if t["type"] == "page")
                break
            except (OSError, StopIteration, ValueError):
                await asyncio.sleep(0.2)
        async with aiohttp.ClientSession() as session, session.ws_connect(page["webSocketDebuggerUrl"],
                                                                          max_msg_size=0) as ws:
            ids = iter(range(1, 10**6))

            errors = []  # the page's uncaught exceptions, reported with the result (for a failing test's message)

            async def call(method, **params):
                i = next(ids)
                await ws.send_json({"id": i, "method": method, "params": params})
                while True:
                    msg = await ws.receive_json()
                    if msg.get("id") == i:
                        return msg
                    if msg.get("method") == "Runtime.exceptionThrown":
                        details = msg["params"]["exceptionDetails"]
                        errors.append(details.get("exception", {}).get("description", details.get("text", ""))[:300])

            await call("Runtime.enable")
            await call("Page.navigate", url=url)
            for _ in range(300):  # the app takes a while to boot
                r = await call("Runtime.evaluate", expression="!!(window.app && window.app.graph && window.LiteGraph)",
                               returnByValue=True)
                if r.get("result", {}).get("result", {}).get("value"):
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(2)
            # What the page threw while booting is the frontend's own: ComfyUI 0.3.64 with its pinned 1.27.10 throws
            # "Cannot read properties of undefined (reading 'id')" from its settings store with no custom node and no
            # workflow at all. Only what loading the workflow throws is counted against it.
            boot_errors = errors[:]
            errors.clear()
            r = await call("Runtime.evaluate", expression=SCRIPT % json.dumps(template), awaitPromise=True,
                           returnByValue=True)
            result = r["result"]
            if "exceptionDetails" in r.get("result", {}) or result.get("result", {}).get("subtype") == "error":
                print(json.dumps({"error": r}))
            else:
                value = json.loads(result["result"]["value"])
                print(json.dumps({**value, "errors": errors, "boot_errors": boot_errors}))
    finally:
        browser.terminate()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
