"""LangGraph as its users run it: a ReAct graph with an async SQLite checkpointer, a thread a run.

    python -m bench.peers.drive_langgraph --base-url URL --runs N --turns T --home DIR

The graph is the one LangGraph's guides build (the prebuilt `create_react_agent`
is deprecated for the `langchain` package's): a model node calling an
OpenAI-compatible chat model pointed at the local model server, the prebuilt
`ToolNode` with one `step` tool, and `tools_condition` between them. Every step
is checkpointed to one SQLite file, `langgraph.db` in `--home`.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import SecretStr

from bench.peers.sample import PeerArgs, Sample, hand_back, measure_runs


@tool
def step(n: int) -> str:
    """Take one step."""
    return f"step {n} done"


def react_graph(model: Runnable[Any, Any]) -> StateGraph[Any]:
    async def call_model(state: MessagesState) -> dict[str, list[Any]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([step]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph


async def drive(args: PeerArgs) -> Sample:
    chat = ChatOpenAI(model="bench-model", base_url=args.base_url, api_key=SecretStr("bench-key"))
    store = args.home / "langgraph.db"
    async with AsyncSqliteSaver.from_conn_string(str(store)) as saver:
        # The tables are made before the counters start: they are not a turn's cost.
        await saver.setup()
        app = react_graph(chat.bind_tools([step])).compile(checkpointer=saver)
        sample = await measure_runs(
            "langgraph",
            runs=args.runs,
            turns_each=args.turns,
            run_one=lambda i: run_one(app, i, args.turns),
            store=store,
        )
    await chat.root_async_client.close()
    return sample


async def run_one(app: CompiledStateGraph[Any], i: int, turns: int) -> int:
    config: RunnableConfig = {
        "configurable": {"thread_id": f"run-{i}"},
        # A turn is two steps (model, tools); the default limit (25) would end long runs early.
        "recursion_limit": 2 * turns + 5,
    }
    state = await app.ainvoke({"messages": [HumanMessage(f"job {i}")]}, config)
    return sum(1 for m in state["messages"] if isinstance(m, AIMessage))


if __name__ == "__main__":
    hand_back(drive)
