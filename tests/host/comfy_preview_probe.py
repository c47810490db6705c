"""Queues a prompt on a running ComfyUI as the canvas does (a websocket client id) and records what the
server sends that client while it runs: the binary preview frames ComfyUI sends for a node's progress
preview (ProgressBar.update_absolute(..., ("JPEG", image, max_size))), each with the node it was for.

Run by test_host_comfyui.py with a Python that has aiohttp and PIL (ComfyUI's own):
    python comfy_preview_probe.py <comfyui url> <prompt.json>
Prints one JSON line: prompt_id, status, frames [{node, value, max, width, height, left_mean}], texts.
Only the loopback address given is used.
"""

import asyncio
import io
import json
import struct
import sys
import uuid

import aiohttp
from PIL import Image

PREVIEW_IMAGE, PREVIEW_IMAGE_WITH_METADATA = 1, 4  # server.BinaryEventTypes


def decode(data: bytes):
    """(metadata or None, PIL image) of a binary preview frame, or None for other binary events."""
    event = struct.unpack(">I", data[:4])[0]
    if event == PREVIEW_IMAGE:  # event, image type (1 JPEG, 2 PNG), image bytes
        return None, Image.open(io.BytesIO(data[8:]))
    if event == PREVIEW_IMAGE_WITH_METADATA:  # event, metadata length, metadata JSON, image bytes
        length = struct.unpack(">I", data[4:8])[0]
        return json.loads(data[8:8 + length]), Image.open(io.BytesIO(data[8 + length:]))
    return None


async def main(url: str, prompt_path: str) -> None:
    prompt = json.loads(open(prompt_path).read())
    client_id = str(uuid.uuid4())
    frames, status, last_progress = [], None, {}
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.ws_connect(f"{url}/ws?clientId={client_id}", max_msg_size=0) as ws:
            async with session.post(f"{url}/prompt", json={"prompt": prompt, "client_id": client_id}) as r:
                answer = await r.json()
            prompt_id = answer.get("prompt_id")
            if prompt_id is None:
                print(json.dumps({"error": answer}))
                return
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    decoded = decode(msg.data)
                    if decoded is None:
                        continue
                    meta, image = decoded
                    image = image.convert("RGB")
                    left = image.crop((0, 0, min(64, image.width), min(64, image.height)))
                    pixels = list(left.getdata())
                    frames.append({
                        "node": (meta or {}).get("node_id", last_progress.get("node")),
                        "value": last_progress.get("value"), "max": last_progress.get("max"),
                        "width": image.width, "height": image.height,
                        "left_mean": sum(sum(p) for p in pixels) / (3 * len(pixels)),
                    })
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    event = json.loads(msg.data)
                    data = event.get("data", {})
                    if event["type"] == "progress" and data.get("prompt_id") == prompt_id:
                        last_progress = data
                    elif event["type"] in ("execution_success", "execution_error", "execution_interrupted") \
                            and data.get("prompt_id") == prompt_id:
                        status = event["type"]
                        break
                else:
                    break
    print(json.dumps({"prompt_id": prompt_id, "status": status, "frames": frames}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
