"""The span model in the shared conventions trace platforms read beside their own (pure, no SDK).

- OpenTelemetry's GenAI semantic conventions (``gen_ai.*``): the operation (``invoke_agent``,
  ``chat``, ``execute_tool``), the model asked and answering, the token counts, the finish
  reason, the tool's name and call id, the agent's name. MLflow and Phoenix both read them.
- Chat-completions tool definitions (``{"type": "function", "function": {name, description,
  parameters}}``): what MLflow's ``mlflow.chat.tools`` and OpenInference's ``llm.tools`` expect.
  NeMo Gym's requests hold the Responses API's flat shape (``{"type": "function", "name": ...}``),
  which neither UI recognises (MLflow shows no "Tools" panel for it).
"""

from __future__ import annotations

from typing import Any

from gym_artifacts.plugin import AGENT, LLM, TOOL, RolloutTrace, Span

OPERATION = {AGENT: "invoke_agent", LLM: "chat", TOOL: "execute_tool"}
TOKEN_KEYS = ("input_tokens", "output_tokens", "total_tokens")


def chat_tool(tool: Any) -> dict[str, Any] | None:
    """One tool definition in chat-completions form (a chat-form one as it is), None when it
    names no function."""
    if not isinstance(tool, dict):
        return None
    if isinstance(tool.get("function"), dict) and tool["function"].get("name"):
        return {"type": "function", "function": dict(tool["function"])}
    name = tool.get("name")
    if tool.get("type", "function") != "function" or not isinstance(name, str) or not name:
        return None
    keys = ("name", "description", "parameters", "strict")
    function = {k: tool[k] for k in keys if tool.get(k) is not None}
    return {"type": "function", "function": function}


def chat_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """The function tools of a request in chat-completions form (others left out)."""
    return [t for t in (chat_tool(tool) for tool in tools) if t is not None]


def token_usage(span: Span) -> dict[str, int]:
    """Input, output and total tokens of a span (the counts every platform shows)."""
    return {k: v for k, v in (span.usage or {}).items() if k in TOKEN_KEYS}


def gen_ai_attributes(trace: RolloutTrace, span: Span) -> dict[str, Any]:
    """``gen_ai.*`` attributes of one span (OpenTelemetry GenAI semantic conventions)."""
    out: dict[str, Any] = {"gen_ai.operation.name": OPERATION.get(span.kind, span.kind.lower())}
    if span.kind == AGENT:
        out["gen_ai.agent.name"] = span.name
        if span.model:
            out["gen_ai.request.model"] = span.model
    if span.kind == LLM:
        out["gen_ai.system"] = "openai"  # NeMo Gym speaks the OpenAI Responses API to its models
        if span.model:
            out["gen_ai.request.model"] = out["gen_ai.response.model"] = span.model
        finish = span.attributes.get("finish_reason")
        if isinstance(finish, str):
            out["gen_ai.response.finish_reasons"] = [finish]
    if span.kind == TOOL:
        out["gen_ai.tool.name"] = span.name
        call_id = span.attributes.get("call_id")
        if call_id:
            out["gen_ai.tool.call.id"] = str(call_id)
        out["gen_ai.tool.type"] = "function"
    if span.kind == LLM:  # on model calls only: a platform sums them into the trace's total
        usage = span.usage or {}
        for ours, theirs in (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens")):
            if ours in usage:
                out[f"gen_ai.usage.{theirs}"] = usage[ours]
        if "cached_tokens" in usage:
            out["gen_ai.usage.cache_read.input_tokens"] = usage["cached_tokens"]
        if "reasoning_tokens" in usage:
            out["gen_ai.usage.reasoning.output_tokens"] = usage["reasoning_tokens"]
    if span.parent_id is None:
        out["gen_ai.conversation.id"] = trace.trace_id
    return out
