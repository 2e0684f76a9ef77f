"""What a person reads in a Responses API rollout (pure functions; one place for every view).

NeMo Gym 0.7 writes the full request (``responses_create_params``) and the full Response
object: the text is in ``output[]`` items (``type: message`` with ``output_text`` parts), tool
calls are ``type: function_call`` items, and there is no ``output_text`` shortcut.
"""

from __future__ import annotations

from typing import Any


def _content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text")) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def last_user_message(request: Any) -> str:
    """The last ``role: user`` message of a Responses API request (or its plain string input)."""
    if not isinstance(request, dict):
        return ""
    items = request.get("input")
    if isinstance(items, str):
        return items
    if not isinstance(items, list):
        return ""
    for item in reversed(items):
        if isinstance(item, dict) and item.get("role") == "user":
            return _content_text(item.get("content"))
    return ""


def response_text(response: Any) -> str:
    """The assistant's text: every ``message`` item of ``output[]``, else ``output_text``."""
    if not isinstance(response, dict):
        return ""
    output = response.get("output")
    parts = []
    if isinstance(output, list):
        for item in output:
            if isinstance(item, dict) and item.get("type", "message") == "message":
                text = _content_text(item.get("content"))
                if text:
                    parts.append(text)
    if not parts and isinstance(response.get("output_text"), str):
        parts.append(response["output_text"])
    return "\n".join(parts)


def tool_calls(response: Any) -> str:
    """``name(arguments)`` of each ``function_call`` item of ``output[]``."""
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        return ""
    calls = [
        f"{item.get('name')}({item.get('arguments') or ''})"
        for item in response["output"]
        if isinstance(item, dict) and item.get("type") == "function_call"
    ]
    return "; ".join(calls)
