"""The API docs pages work without internet access (docs/api.md): every script, style and icon
they load is served by the app itself, and a real browser that can reach nothing but this
machine renders the operations."""

from __future__ import annotations

import re
import shutil
import subprocess
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from api.wrapper_app import create_app as create_wrapper_app
from tests.api_support import LiveManager, api_env

# every URL an HTML page loads from: src=, href=, url: '…' (Swagger UI's document), spec-url=
LOADED = re.compile(r"""(?:\bsrc|\bhref|\bspec-url)\s*=\s*["']([^"']+)["']|\burl:\s*["']([^"']+)["']""")
CONTENT_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png", ".json": "application/json"}


def _wrapper_app() -> Any:
    # /docs touches nothing of the wrapper but its name: a stand-in is enough
    wrapper = SimpleNamespace(config=SimpleNamespace(source="shop", capture=SimpleNamespace(method="triggers")))
    return create_wrapper_app(wrapper, manager_token="secret")  # type: ignore[arg-type]


async def _assert_served_offline(client: httpx.AsyncClient, page: str) -> None:
    r = await client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), page
    html = r.text
    urls = [a or b for a, b in LOADED.findall(html)]
    assert urls, html
    # nothing from another host: no scheme, no protocol-relative URL, anywhere in the page
    assert "http://" not in html and "https://" not in html and "//" not in "".join(urls), html
    for url in urls:
        assert url.startswith("/"), url
        asset = await client.get(url)
        assert asset.status_code == 200, url
        kind = next(v for k, v in CONTENT_TYPES.items() if url.endswith(k))
        assert kind in asset.headers["content-type"], (url, asset.headers["content-type"])
        assert len(asset.content) > 100, url
    scripts = [u for u in urls if u.endswith(".js")]
    assert scripts, html


async def test_manager_docs_load_nothing_from_other_hosts(tmp_path):
    async with api_env(tmp_path) as env:
        for page in ("/docs", "/redoc"):
            await _assert_served_offline(env.client, page)
        # no token needed, as for the OpenAPI document itself
        assert (await env.client.get("/docs-assets/swagger-ui-bundle.js")).status_code == 200


async def test_wrapper_docs_load_nothing_from_other_hosts():
    transport = httpx.ASGITransport(app=_wrapper_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://wrapper.test") as client:
        for page in ("/docs", "/redoc"):
            await _assert_served_offline(client, page)


def _render(url: str, profile: str) -> str:
    """The DOM of ``url`` after headless Chromium ran its scripts, with every host name but
    the loopback address unresolvable: a page that needs the internet stays blank."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is missing: bash scripts/setup.sh installs it (Debian's chromium)"
    done = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.browser
def test_a_browser_renders_the_operations_without_internet(tmp_path):
    with LiveManager(tmp_path) as live:
        dom = _render(f"{live.url}/docs", str(tmp_path / "profile"))
    # Swagger UI drew one block per operation, each with its path
    assert 'class="opblock ' in dom, dom[-3000:]
    assert 'data-path="/v1/views"' in dom, dom[-3000:]
    assert 'data-path="/v1/tokens"' in dom
