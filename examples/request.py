"""Sends the README's sample request (examples/cat.png as a base64 data URL) to a running Tandem
and prints the answer and its trace. Usage: python examples/request.py [BASE_URL] [MODEL]"""

import base64
import json
import sys
import urllib.request
from pathlib import Path

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
model = sys.argv[2] if len(sys.argv) > 2 else "tandem"
image = base64.b64encode((Path(__file__).parent / "cat.png").read_bytes()).decode()
body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
    {"type": "text", "text": "How many legs does the cat have?"}]}]}
request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=120) as response:
    print(json.dumps(json.loads(response.read()), indent=2))
