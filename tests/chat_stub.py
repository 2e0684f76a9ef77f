"""A deterministic OpenAI-compatible chat-completions model for a real NeMo Gym collection.

NeMo Gym's ``vllm_model`` server calls ``POST /v1/chat/completions``; this answers as a model
would for the ``example_single_tool_call`` data (5 weather prompts):

* a prompt naming a city ("sf") gets a ``get_weather`` tool call first, then a final message
  once the tool's answer is in the conversation (NeMo Gym rewards those rollouts 1);
* "how's the outside?" gets a final message without any tool call (reward 0);
* "get the weather for 3 cities" fails with HTTP 500 every time (a failed rollout), while
  ``failing`` is on (NeMo Gym ends a collection with a failed rollout in error unless
  ``+route_failures_to_sidecar=true``).

Served from a thread of the test process (``ChatStub``), bound to 127.0.0.1 on a free port.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAILING_PROMPT = "3 cities"  # the prompt whose model calls fail (HTTP 500)
TOOL_PROMPT = "sf"  # prompts naming this city call get_weather


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def completion(request: dict[str, Any], failing: bool = True) -> dict[str, Any] | None:
    """The chat completion for ``request``; None for the failing prompt (when ``failing``)."""
    messages = request.get("messages") or []
    prompt = _last_user_text(messages)
    if failing and FAILING_PROMPT in prompt:
        return None
    names_city = re.search(rf"\b{TOOL_PROMPT}\b", prompt) is not None
    if names_city and not any(m.get("role") == "tool" for m in messages):
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_weather_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "San Francisco"})},
                }
            ],
        }
        finish = "tool_calls"
    else:
        message = {"role": "assistant", "content": "It is sunny and mild today."}
        finish = "stop"
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": request.get("model") or "stub-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": "stub-model", "object": "model"}]})
        else:
            self._send(200, {"status": "ok"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "bad JSON"}})
            return
        self.server.calls += 1  # type: ignore[attr-defined]
        time.sleep(self.server.delay_s)  # type: ignore[attr-defined]
        answer = completion(request, self.server.failing) if self.path.endswith("/chat/completions") else None
        if answer is None:
            self._send(500, {"error": {"message": "stub model: internal error", "type": "server_error"}})
        else:
            self._send(200, answer)


class ChatStub:
    """The stub model server in a daemon thread; ``url`` is its OpenAI base URL (``.../v1``)."""

    def __init__(self, failing: bool = True) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.calls = 0  # type: ignore[attr-defined]
        self.failing = failing
        self.delay_s = 0.0
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def failing(self) -> bool:
        """Whether the failing prompt's calls fail now (switchable between collections)."""
        return self._server.failing  # type: ignore[attr-defined,no-any-return]

    @failing.setter
    def failing(self, value: bool) -> None:
        self._server.failing = value  # type: ignore[attr-defined]

    @property
    def delay_s(self) -> float:
        """Seconds each answer takes (a model's latency: stretches a collection out in time)."""
        return self._server.delay_s  # type: ignore[attr-defined,no-any-return]

    @delay_s.setter
    def delay_s(self, value: float) -> None:
        self._server.delay_s = value  # type: ignore[attr-defined]

    @property
    def calls(self) -> int:
        return self._server.calls  # type: ignore[attr-defined]

    def __enter__(self) -> ChatStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


if __name__ == "__main__":  # a stand-alone stub for trying NeMo Gym by hand
    with ChatStub(failing="--no-failures" not in sys.argv) as stub:
        print(stub.url, flush=True)
        while True:
            time.sleep(3600)
