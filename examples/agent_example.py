"""An agent submits a plan and waits for it.

Run it as `python examples/agent_example.py`, with `tidemark dev` running and the ledger plugin
installed. It reaches Temporal as the `tidemark` command does: the settings of its environment
(TEMPORAL_CONFIG_FILE's profile, TEMPORAL_ADDRESS, TIDEMARK_TASK_QUEUE, ...)."""
import asyncio

from tools.operate.client import PlanBuilder, TidemarkClient


async def main(task_id: str = "agent-example") -> str:
    tm = await TidemarkClient.connect()  # the CLI's settings, read from the environment
    plan = PlanBuilder(task_id).add("ledger.post_invoice", customer="acme", amount=120_000,
                                    currency="eur", reference="2026-Q3 retainer")
    run = await tm.submit(plan)  # validated here first; the workflow is tidemark-<task_id>
    result = await run.wait()
    print(result.state, await run.status())
    return result.state

if __name__ == "__main__":
    asyncio.run(main())
