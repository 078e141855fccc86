"""``python -m chaos [scenario ...] [--scale F] [--out chaos/results.md]``: run scenarios, print
and write the summary table. ``--scale 1`` (the default) is the issue's full numbers; CI runs the
fast scenarios at a small scale through ``tests/chaos``."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
import traceback
from pathlib import Path

from chaos.report import Result, table, write
from chaos.scenarios import FAST, SCENARIOS, Scenario


async def _run(scenario: Scenario, scale: float, log_dir: Path) -> Result:
    return await scenario(scale, log_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("scenarios", nargs="*", help=f"names (default: all): {', '.join(SCENARIOS)}")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full notification counts")
    parser.add_argument("--fast", action="store_true", help=f"only the fast scenarios ({', '.join(FAST)})")
    parser.add_argument("--out", type=Path, default=Path("chaos/results.md"))
    parser.add_argument("--logs", type=Path, default=None, help="where process logs go (default: a temp dir)")
    args = parser.parse_args(argv)
    names = args.scenarios or (list(FAST) if args.fast else list(SCENARIOS))
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(unknown)}")
    logs = args.logs or Path(f"/tmp/clarion-chaos-{time.strftime('%Y%m%d-%H%M%S')}")
    # SIGTERM ends the run like Ctrl-C, so every scenario's `finally` stops its processes.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    results: list[Result] = []
    for name in names:
        print(f"== scenario {name} (scale {args.scale}); logs in {logs / name}", flush=True)
        started = time.monotonic()
        result: Result
        try:
            result = asyncio.run(_run(SCENARIOS[name], args.scale, logs / name))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except Exception as exc:
            traceback.print_exc()
            result = Result(name, 0, passed=False, failures=[f"crashed: {type(exc).__name__}: {exc}"])
        result.elapsed_s = round(time.monotonic() - started, 1)
        results.append(result)
        print(result.printable(), flush=True)
    command = "python -m chaos " + " ".join(sys.argv[1:] if argv is None else argv)
    write(results, args.out, command=command.strip())
    print("\n" + table(results), flush=True)
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
