"""Server-side fetches and API keys: the server must never fetch for a client what the operator did
not allow (SSRF), and keys must gate everything but the health probes."""

import http.server
import threading
import time

import pytest

from tandem.auth import check_authorization, load_api_keys
from tandem.config import HttpConfig, load_tandem_config
from tandem.errors import BadRequest, ConfigError, PayloadTooLarge, Unauthorized
from tandem.fetch import fetch_image, is_public_address
from tandem.openai_api import parse_chat_request

from tests.conftest import make_png

PNG = make_png(0, 16, 12)  # under the 4096-byte cap these tests use


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/cat.png":
            self._send(200, PNG, {"Content-Length": str(len(PNG))})
        elif self.path == "/redirect":
            self._send(302, b"", {"Location": "http://169.254.169.254/"})
        elif self.path == "/big":
            self._send(200, b"x" * 5000, {"Content-Length": "5000"})
        elif self.path == "/big-undeclared":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"x" * 5000)
        elif self.path == "/slow":
            time.sleep(1.0)
            self._send(200, PNG, {})

    def _send(self, status, body, headers):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()


def fetch(url, **kw):
    """A fetch in which images.test resolves to this machine and, for the test only, loopback counts
    as allowed; everything else is the production code path."""
    opts = dict(allowed_hosts=("images.test",), timeout_s=0.5, max_bytes=4096,
                resolver=lambda host, port: ["127.0.0.1"], address_allowed=lambda a: True)
    opts.update(kw)
    return fetch_image(url, **opts)


def test_allow_listed_host_is_fetched(server):
    assert fetch(f"http://images.test:{server}/cat.png") == PNG


@pytest.mark.parametrize("path, error, fragment", [
    ("/redirect", BadRequest, "HTTP 302"), ("/big", PayloadTooLarge, "5000 bytes"),
    ("/big-undeclared", PayloadTooLarge, "over the limit"), ("/slow", BadRequest, "could not be fetched"),
])
def test_fetch_guards(server, path, error, fragment):
    with pytest.raises(error, match=fragment):
        fetch(f"http://images.test:{server}{path}")


@pytest.mark.parametrize("url, fragment", [
    ("http://evil.test/cat.png", "not on the allow-list"), ("file:///etc/passwd", "scheme 'file'"),
    ("ftp://images.test/x", "scheme 'ftp'"), ("http://user:pw@images.test/x", "credentials"),
    ("gopher://images.test/", "scheme 'gopher'"),
])
def test_urls_refused_before_any_connection(url, fragment):
    with pytest.raises(BadRequest, match=fragment):
        fetch(url, resolver=lambda h, p: pytest.fail("resolved a refused URL"))


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.8", "172.16.3.4", "192.168.1.1", "169.254.169.254",
                                     "100.64.0.1", "0.0.0.0", "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1",
                                     "224.0.0.1"])
def test_non_public_addresses_are_refused_by_default(server, address):
    assert not is_public_address(address)
    with pytest.raises(BadRequest, match="non-public address"):
        fetch(f"http://images.test:{server}/cat.png", resolver=lambda h, p: [address],
              address_allowed=is_public_address)


def test_one_private_address_among_public_ones_is_refused(server):
    with pytest.raises(BadRequest, match="non-public"):
        fetch("http://images.test/cat.png", resolver=lambda h, p: ["93.184.216.34", "10.0.0.1"],
              address_allowed=is_public_address)


def test_public_addresses_pass():
    assert is_public_address("93.184.216.34") and is_public_address("2606:4700::1111")


def test_remote_urls_refused_unless_allow_listed_and_localhost_refused_even_then():
    body = lambda url: ('{"model": "tandem", "messages": [{"role": "user", "content": [{"type": "image_url", '  # noqa
                        f'"image_url": {{"url": "{url}"}}}}, {{"type": "text", "text": "q"}}]}}]}}').encode()
    with pytest.raises(BadRequest, match="refused unless an operator allow-lists"):
        parse_chat_request(body("http://localhost/cat.png"), load_tandem_config({}))
    cfg = load_tandem_config({"http": {"allowed_image_hosts": ["localhost"]}})
    with pytest.raises(BadRequest, match="non-public address"):
        parse_chat_request(body("http://localhost/cat.png"), cfg)


def test_api_keys_off_by_default():
    keys = load_api_keys(HttpConfig())
    assert keys == frozenset()
    check_authorization(None, keys)


def test_api_keys_from_env_and_file(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_KEYS", "k1, k2")
    (tmp_path / "keys").write_text("k3\n")
    keys = load_api_keys(HttpConfig(api_keys_env="TANDEM_KEYS", api_keys_file=str(tmp_path / "keys")))
    assert keys == {"k1", "k2", "k3"}
    check_authorization("Bearer k2", keys)
    for header in (None, "", "Bearer", "Bearer nope", "Basic k1", "k1", "Bearer k1x"):
        with pytest.raises(Unauthorized):
            check_authorization(header, keys)


def test_enabled_but_empty_keys_fail_at_start(monkeypatch):
    monkeypatch.delenv("TANDEM_NO_KEYS", raising=False)
    with pytest.raises(ConfigError, match="none were found"):
        load_api_keys(HttpConfig(api_keys_env="TANDEM_NO_KEYS"))
