"""Drives approvals (issue 30) on a real `turnstile serve` with agno's own AgentOSClient
(agno==3.1.10), unchanged: a paused run's requirements confirmed or rejected through
agno's own `RunRequirement`, and the run continued with `continue_agent_run`.

Usage: python3 approvals.py BASE_URL, against a server whose `scripted` agent has
`approvals = ["Bash"]`. Exits non-zero, with the failing step, on any surprise.
"""

import asyncio
import sys

from agno.client import AgentOSClient
from agno.run.agent import RunCompletedEvent, RunContinuedEvent, RunPausedEvent
from agno.run.base import RunStatus


async def main(base_url: str) -> None:
    client = AgentOSClient(base_url=base_url)

    run = await client.run_agent("scripted", '/tool Bash {"command": "make"}\nbuilt', session_id="agno-hitl")
    assert run.status == RunStatus.paused, run.status
    assert run.is_paused, run
    assert len(run.active_requirements) == 1, run.requirements
    requirement = run.active_requirements[0]
    assert requirement.needs_confirmation, requirement
    assert requirement.tool_execution.tool_name == "Bash", requirement.tool_execution
    assert requirement.tool_execution.tool_args == {"command": "make"}, requirement.tool_execution
    requirement.confirm()
    continued = await client.continue_agent_run(
        "scripted", run.run_id, tools=[requirement.tool_execution], session_id="agno-hitl"
    )
    assert continued.status == RunStatus.completed, continued.status
    assert continued.run_id == run.run_id, continued.run_id
    assert continued.content == "echo: built", continued.content
    assert continued.tools[0].confirmed is True and continued.tools[0].result == "ok:Bash", continued.tools

    events = [
        event
        async for event in client.run_agent_stream(
            "scripted", '/tool Bash {"command": "rm -rf build"}\nkept', session_id="agno-hitl-stream"
        )
    ]
    paused = events[-1]
    assert isinstance(paused, RunPausedEvent), [type(event) for event in events]
    assert paused.tools[0].requires_confirmation, paused.tools
    rejected = paused.active_requirements[0]
    rejected.reject("keep the build")
    events = [
        event
        async for event in client.continue_agent_run_stream(
            "scripted", paused.run_id, tools=[rejected.tool_execution], session_id="agno-hitl-stream"
        )
    ]
    assert isinstance(events[0], RunContinuedEvent), [type(event) for event in events]
    assert isinstance(events[-1], RunCompletedEvent), [type(event) for event in events]
    final = await client.get_session_run("agno-hitl-stream", paused.run_id)
    assert final.tools[0]["confirmed"] is False, final.tools
    assert "keep the build" in final.tools[0]["result"], final.tools
    print("agno AgentOSClient: paused and continued")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
