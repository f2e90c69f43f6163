"""RL rollouts on forks of one prepared workspace, with the plain Python API.

Set up a repository once, snapshot it, fork it 16 times (each fork's files are the
workspace's at that moment, at the same paths, with nothing running: O(1), no copy), run
one rollout per fork (a different change, then the test), gather the rewards, delete the
forks and the snapshot.

    bashfleet up --detach          # a local fleet (or BASHFLEET_REDIS_URL naming one)
    python examples/rl_fork.py
"""

from __future__ import annotations

import asyncio

from bashfleet.client.aio import AsyncFleet, AsyncWorkspace

SETUP = """\
mkdir -p repo && cd repo && git init -q
printf 'def add(a, b):\\n    return a - b\\n' > calc.py
printf 'from calc import add\\nassert add(2, 3) == 5, add(2, 3)\\n' > test_calc.py
git add -A && git -c user.name=rl -c user.email=rl@localhost commit -qm base
"""

#: What each rollout tries: in a real loop, the edits of one policy sample each.
CANDIDATES = ["a + b", "a - b", "b - a", "a * b", "b + a", "a + b + 0", "abs(a - b)",
              "a // b", "sum((a, b))", "max(a, b)", "a + b - 1", "(a + b) * 1",
              "a ** b", "b", "a + a", "-(-a - b)"]


async def rollout(fork: AsyncWorkspace, candidate: str) -> float:
    """One episode in its own fork: apply the change, run the test; 1.0 when it passes."""
    await fork.write_file("repo/calc.py", f"def add(a, b):\n    return {candidate}\n")
    result = await fork.run("cd repo && python3 test_calc.py", check=False)
    return 1.0 if result.exit_code == 0 else 0.0


async def main() -> None:
    async with AsyncFleet() as fleet, await fleet.workspace(ttl_s=600) as workspace:
        await workspace.run(SETUP)
        snapshot = await workspace.snapshot()  # the prepared state, for the next batch too
        forks = await workspace.fork(len(CANDIDATES))
        try:
            rewards = await asyncio.gather(*map(rollout, forks, CANDIDATES))
        finally:
            await asyncio.gather(*(fork.delete() for fork in forks))
            await fleet.delete_snapshot(snapshot)
    for candidate, reward in zip(CANDIDATES, rewards, strict=True):
        print(f"{reward:.0f}  return {candidate}")
    print(f"mean reward {sum(rewards) / len(rewards):.2f} over {len(rewards)} forks")


if __name__ == "__main__":
    asyncio.run(main())
