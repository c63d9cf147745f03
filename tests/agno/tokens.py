"""Drives a `turnstile serve` in `[auth] mode = "jwt"` with per-user isolation using agno's
own AgentOSClient (agno==3.1.10), with each user's bearer token in the headers agno's
client sends: alice runs, streams, continues and cancels; she sees her own sessions,
runs and metrics only; bob's session is 404 to her; a read-only token is 403 on a run.

Usage: python3 tokens.py BASE_URL ALICE_TOKEN BOB_TOKEN READER_TOKEN.
"""

import asyncio
import sys

from httpx import HTTPStatusError

from agno.client import AgentOSClient
from agno.run.agent import RunCompletedEvent
from agno.run.base import RunStatus


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


async def refused(call, status: int) -> None:
    try:
        await call
    except HTTPStatusError as error:
        assert error.response.status_code == status, (error.response.status_code, error.response.text)
        return
    raise AssertionError(f"expected {status}")


async def main(base_url: str, alice: str, bob: str, reader: str) -> None:
    client = AgentOSClient(base_url=base_url)
    as_alice, as_bob = bearer(alice), bearer(bob)

    agents = await client.list_agents(headers=as_alice)
    assert [agent.id for agent in agents] == ["scripted"], agents

    # The token names the user, whatever the call says.
    run = await client.run_agent(
        "scripted", "hello agno", session_id="alice-session", user_id="someone-else", headers=as_alice
    )
    assert run.status == RunStatus.completed, run.status
    assert run.user_id == "alice", run.user_id
    events = [
        event
        async for event in client.run_agent_stream(
            "scripted", "/reply streamed", session_id="alice-session", headers=as_alice
        )
    ]
    assert isinstance(events[-1], RunCompletedEvent), events[-1]
    continued = await client.continue_agent_run(
        "scripted", events[-1].run_id, tools=[], session_id="alice-session", input="and then?", headers=as_alice
    )
    assert continued.status == RunStatus.completed, continued.status
    background = await client.run_agent(
        "scripted", "/sleep 30000", session_id="alice-background", background="true", headers=as_alice
    )
    await client.cancel_agent_run("scripted", background.run_id, headers=as_alice)

    await client.run_agent("scripted", "bob's turn", session_id="bob-session", headers=as_bob)

    sessions = await client.get_sessions(headers=as_alice)
    ids = sorted(session.session_id for session in sessions.data)
    assert ids == ["alice-background", "alice-session"], ids
    assert sessions.meta.total_count == 2, sessions.meta
    session = await client.get_session("alice-session", headers=as_alice)
    assert session.session_id == "alice-session", session
    runs = await client.get_session_runs("alice-session", headers=as_alice)
    assert len(runs) == 3, runs
    metrics = await client.get_metrics(headers=as_alice)
    assert sum(day.agent_runs_count for day in metrics.metrics) == 4, metrics

    # Another user's session is not there for her; a token without the scope is 403.
    await refused(client.get_session("bob-session", headers=as_alice), 404)
    await refused(client.get_session_runs("bob-session", headers=as_alice), 404)
    await refused(client.run_agent("scripted", "take it", session_id="bob-session", headers=as_alice), 404)
    await refused(client.run_agent("scripted", "hi", headers=bearer(reader)), 403)
    await refused(client.list_agents(), 401)
    print("agno AgentOSClient with tokens: all calls parsed")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
