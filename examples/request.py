"""Sends the README's sample request to a running Tandem: examples/grid.png (a held-out item of the
grid task the default models were trained on) as a base64 data URL, with its question and options.
Prints the response with its trace, then the expected answer.
Usage: python examples/request.py [BASE_URL] [MODEL]"""

import base64
import json
import sys
import urllib.request
from pathlib import Path

here = Path(__file__).parent
base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
model = sys.argv[2] if len(sys.argv) > 2 else "tandem"
sample = json.loads((here / "grid.json").read_text())
image = base64.b64encode((here / sample["image"]).read_bytes()).decode()
body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
    {"type": "text", "text": sample["prompt"]}]}]}
request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=120) as response:
    data = json.loads(response.read())
print(json.dumps(data, indent=2))
answer = data["choices"][0]["message"]["content"]
print(f"\nquestion: {sample['prompt']!r}\nanswer: {answer!r}  (expected: {sample['answer_text']!r}, "
      f"option {sample['answer']}; path: {data['tandem']['path']})")
