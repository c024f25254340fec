"""Copies serve_config.gpu.yaml into cluster/kuberay-rayservice.yaml's serveConfigV2, verbatim (its
leading comments aside). Run after editing the serve config; a unit test fails while they differ.

    python cluster/sync_kuberay.py
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    serve = (ROOT / "serve_config.gpu.yaml").read_text()
    body = serve[serve.index("proxy_location:"):].rstrip()
    embedded = "\n".join(("    " + line) if line.strip() else "" for line in body.splitlines())
    manifest_path = ROOT / "cluster" / "kuberay-rayservice.yaml"
    manifest = manifest_path.read_text()
    head, rest = manifest.split("  serveConfigV2: |\n", 1)
    tail = rest[rest.index("\n  rayClusterConfig:"):]
    manifest_path.write_text(f"{head}  serveConfigV2: |\n{embedded}\n{tail}")


if __name__ == "__main__":
    main()
