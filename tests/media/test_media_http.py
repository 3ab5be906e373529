"""Media parts over HTTP against a text-only model: every media part is a 400 naming it,
decided before anything is fetched (the model's media_kinds check comes first), and the
video sampling fields are checked with the body."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import trio
from media_helpers import data_url, image_bytes

from vllm_mlx_trio.testing.fake_executor import text_script
from vllm_mlx_trio.testing.harness import fake_executor_factory, open_server

MODEL = "demo:tiny"


class CountingHandler(BaseHTTPRequestHandler):
    hits = 0

    def log_message(self, *args):
        pass

    def do_GET(self):
        CountingHandler.hits += 1
        body = image_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def image_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), CountingHandler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def text_then(*parts) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "Look:"}, *parts]}]


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


async def post_all(cfg, bodies: list[dict]) -> list[httpx.Response]:
    script = text_script("Hello, world!", then_eos=True)
    with trio.fail_after(30):
        async with open_server(cfg, executor_factory=fake_executor_factory(script=script, step_s=0.001)) as srv:
            async with httpx.AsyncClient() as http:
                return [await http.post(f"{srv.url}/v1/chat/completions", json=body) for body in bodies]


def media_bodies(image_server: str) -> dict[str, dict]:
    png = image_bytes()
    parts = {
        "base64 png": image_part(data_url(png)),
        "bad base64": image_part("data:image/png;base64,@@@"),
        "text posing as an image": image_part(data_url(b"hello, I am text")),
        "loopback url": image_part(f"{image_server}/a.png"),
        "private url": image_part("http://10.0.0.1/a.png"),
        "metadata url": image_part("http://169.254.169.254/latest/meta-data/"),
        "local path": image_part("/etc/passwd"),
        "video_url": {"type": "video_url", "video_url": {"url": f"{image_server}/v.mp4"}},
        "video": {"type": "video", "video": f"{image_server}/v.mp4"},
    }
    return {name: {"model": MODEL, "messages": text_then(part)} for name, part in parts.items()}


async def test_a_text_model_refuses_every_media_part_without_fetching(fake_cfg, image_server):
    bodies = media_bodies(image_server)
    CountingHandler.hits = 0
    responses = await post_all(fake_cfg, list(bodies.values()))
    for name, resp in zip(bodies, responses, strict=True):
        assert resp.status_code == 400, (name, resp.text)
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, name
        assert error["type"] == "invalid_request_error" and error["param"] == "messages[0].content[1]", name
        assert "not supported by this model" in error["message"], name
    assert CountingHandler.hits == 0  # a text model never fetches


async def test_too_many_parts_on_a_text_model_name_the_first_part(fake_cfg, image_server):
    body = {"model": MODEL, "messages": text_then(*[image_part(f"{image_server}/{i}.png") for i in range(20)])}
    CountingHandler.hits = 0
    (resp,) = await post_all(fake_cfg, [body])
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages[0].content[1]"
    assert CountingHandler.hits == 0


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"video_fps": -1}, "video_fps"),
        ({"video_fps": 0}, "video_fps"),
        ({"video_fps": "2"}, "video_fps"),
        ({"video_max_frames": 0}, "video_max_frames"),
        ({"video_max_frames": 1}, "video_max_frames"),
        ({"video_max_frames": 2.5}, "video_max_frames"),
        ({"video_max_frames": True}, "video_max_frames"),
    ],
)
async def test_bad_video_sampling_fields_are_400s(fake_cfg, fields, param):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}
    (resp,) = await post_all(fake_cfg, [body])
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


async def test_video_sampling_fields_are_accepted_with_text(fake_cfg):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "video_fps": 1.5, "video_max_frames": 8}
    (resp,) = await post_all(fake_cfg, [body])
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "Hello, world!"


async def test_a_malformed_video_part_is_a_400_naming_it(fake_cfg):
    body = {"model": MODEL, "messages": text_then({"type": "video", "video": {"url": 3}})}
    (resp,) = await post_all(fake_cfg, [body])
    assert resp.status_code == 400 and json.loads(resp.text)["error"]["param"] == "messages[0].content[1]"
