"""Drives a real `turnstile serve` with agno's own AgentOSClient (agno==3.1.10).

Usage: python3 compat.py BASE_URL. Exits non-zero, with the failing step, when any
response does not parse into agno's models or holds unexpected values.
"""

import asyncio
import sys

from agno.client import AgentOSClient
from agno.run.agent import RunCompletedEvent, RunContentEvent, RunStartedEvent, ToolCallCompletedEvent
from agno.run.base import RunStatus


async def main(base_url: str) -> None:
    client = AgentOSClient(base_url=base_url)

    agents = await client.list_agents()
    assert [agent.id for agent in agents] == ["scripted"], agents
    agent = await client.aget_agent("scripted")
    assert agent.id == "scripted", agent

    run = await client.run_agent("scripted", "hello agno", session_id="agno-session", user_id="agno-user")
    assert run.status == RunStatus.completed, run.status
    assert run.content == "echo: hello agno", run.content
    assert run.session_id == "agno-session", run.session_id
    assert run.messages and all(message.role for message in run.messages)

    events = []
    async for event in client.run_agent_stream(
        "scripted", "look\n/tool Read {\"path\": \"a\"}\n/reply streamed", session_id="agno-session"
    ):
        events.append(event)
    kinds = [type(event) for event in events]
    assert kinds[0] is RunStartedEvent, kinds
    assert ToolCallCompletedEvent in kinds, kinds
    assert RunContentEvent in kinds, kinds
    assert kinds[-1] is RunCompletedEvent, kinds
    assert events[-1].content == "streamed", events[-1]
    streamed_run_id = events[-1].run_id

    continued = await client.continue_agent_run(
        "scripted", streamed_run_id, tools=[], session_id="agno-session", continue_from="end", input="and then?"
    )
    assert continued.status == RunStatus.completed, continued.status
    assert continued.run_id != streamed_run_id

    background = await client.run_agent(
        "scripted", "/sleep 30000", session_id="agno-background", background="true"
    )
    assert background.run_id, background
    await client.cancel_agent_run("scripted", background.run_id)
    await client.cancel_agent_run("scripted", "no-such-run")

    sessions = await client.get_sessions(user_id="agno-user")
    assert [session.session_id for session in sessions.data] == ["agno-session"], sessions
    assert sessions.meta.total_count == 1, sessions.meta
    session = await client.get_session("agno-session")
    assert session.session_id == "agno-session" and session.agent_id == "scripted", session
    assert session.total_tokens and session.total_tokens > 0, session
    runs = await client.get_session_runs("agno-session")
    assert len(runs) == 3, runs
    assert all(run.run_id for run in runs), runs

    metrics = await client.get_metrics()
    assert metrics.metrics and metrics.metrics[0].agent_runs_count >= 4, metrics
    print("agno AgentOSClient: all calls parsed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
