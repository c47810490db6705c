"""Loads a UI-format workflow into the real ComfyUI frontend in headless Chromium and prints what the
canvas makes of it: the API prompt it would queue (app.graphToPrompt), any missing node types, and each
node's position, size and the least size the canvas computes for it (LGraphNode.computeSize), and the nodes
each group holds by the canvas' own rule (LGraphGroup.recomputeInsideNodes), and the page's uncaught exceptions (while
it booted, and while it loaded the workflow).

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
  const wf = await (await fetch(%s)).json();
  await window.app.loadGraphData(wf);
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
  return JSON.stringify({nodes, groups, output: prompt.output});
})()
"""


async def main(url: str, template: str, chromium: str) -> None:
    port = 9300 + int(time.time()) % 500
    profile = tempfile.mkdtemp()
    browser = subprocess.Popen([
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
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
