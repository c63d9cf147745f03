"""Drives a real `turnstile serve` whose agent `codex` runs the real codex CLI, with agno's
own AgentOSClient (agno==3.1.10): run, stream, continue, cancel and sessions.

Usage: python3 codex.py BASE_URL. The model is the tests' fake Responses API, scripted by
`@` lines in the prompts. Exits non-zero, with the failing step, when any response does
not parse into agno's models or holds unexpected values.
"""

import asyncio
import sys

from agno.client import AgentOSClient
from agno.run.agent import RunCompletedEvent, RunContentEvent, RunStartedEvent, ToolCallCompletedEvent
from agno.run.base import RunStatus


async def main(base_url: str) -> None:
    client = AgentOSClient(base_url=base_url)

    agent = await client.aget_agent("codex")
    assert agent.id == "codex", agent

    run = await client.run_agent("codex", "hello codex\n@reply hi from codex", session_id="agno-codex", user_id="agno-user")
    assert run.status == RunStatus.completed, run.status
    assert run.content == "hi from codex", run.content
    assert run.messages and all(message.role for message in run.messages)

    events = []
    async for event in client.run_agent_stream(
        "codex", "look\n@bash echo agno-tool\n@reply streamed", session_id="agno-codex"
    ):
        events.append(event)
    kinds = [type(event) for event in events]
    assert kinds[0] is RunStartedEvent, kinds
    assert ToolCallCompletedEvent in kinds, kinds
    tool = next(event for event in events if isinstance(event, ToolCallCompletedEvent)).tool
    assert tool.tool_name == "shell" and "agno-tool" in (tool.result or ""), tool
    assert RunContentEvent in kinds, kinds
    assert kinds[-1] is RunCompletedEvent, kinds
    assert events[-1].content == "streamed", events[-1]
    streamed_run_id = events[-1].run_id

    continued = await client.continue_agent_run(
        "codex", streamed_run_id, tools=[], session_id="agno-codex", continue_from="end", input="and then?\n@reply continued"
    )
    assert continued.status == RunStatus.completed, continued.status
    assert continued.content == "continued", continued.content
    assert continued.run_id != streamed_run_id

    background = await client.run_agent(
        "codex", "wait\n@bash sleep 30", session_id="agno-codex-background", background="true"
    )
    assert background.run_id, background
    await asyncio.sleep(1.0)
    await client.cancel_agent_run("codex", background.run_id)
    for _ in range(100):
        cancelled = await client.get_session_run("agno-codex-background", background.run_id)
        if cancelled.status == RunStatus.cancelled:
            break
        await asyncio.sleep(0.1)
    assert cancelled.status == RunStatus.cancelled, cancelled.status

    sessions = await client.get_sessions(user_id="agno-user")
    assert [session.session_id for session in sessions.data] == ["agno-codex"], sessions
    session = await client.get_session("agno-codex")
    assert session.session_id == "agno-codex" and session.agent_id == "codex", session
    assert session.total_tokens and session.total_tokens > 0, session
    runs = await client.get_session_runs("agno-codex")
    assert len(runs) == 3, runs
    print("agno AgentOSClient with codex: all calls parsed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
