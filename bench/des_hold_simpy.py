#!/usr/bin/python3
"""The hold-model benchmark of bench/des_hold.cpp, in SimPy, for comparison.

`timers` concurrent processes each hold for a pseudo-random delay, again and again, until
`events` holds have completed in total. Delays are uniform on (0, 2) microseconds (mean 1 us),
drawn from Python's seeded Mersenne Twister; the event structure matches the C++ benchmark, the
random numbers do not (the figure of merit is events per second, not the simulated end time).

Debian 12's python3-simpy is SimPy 2.3.1 (module `SimPy`, process-oriented API with
`yield hold, self, delay`), which this script uses; SimPy 3+ (module `simpy`) is used instead
when it is the one installed.

Usage: /usr/bin/python3 bench/des_hold_simpy.py [timers=1000] [events=1000000] [seed=1]
Prints one JSON line like kvtier_bench_des_hold.
"""

import json
import random
import sys
import time


def run_simpy2(timers, events, seed):
    from SimPy.Simulation import Process, Simulation, hold

    rng = random.Random(seed)
    state = {"scheduled": 0}
    sim = Simulation()
    sim.initialize()

    class Timer(Process):
        def run(self):
            while True:
                yield hold, self, rng.random() * 2.0
                if state["scheduled"] >= events:
                    return
                state["scheduled"] += 1

    for _ in range(min(timers, events)):
        state["scheduled"] += 1
        timer = Timer(sim=sim)
        sim.activate(timer, timer.run())
    started = time.perf_counter()
    sim.simulate(until=float("inf"))
    return time.perf_counter() - started, sim.now(), "SimPy 2"


def run_simpy3(timers, events, seed):
    import simpy

    rng = random.Random(seed)
    state = {"scheduled": 0}
    env = simpy.Environment()

    def timer(env):
        while True:
            yield env.timeout(rng.random() * 2.0)
            if state["scheduled"] >= events:
                return
            state["scheduled"] += 1

    for _ in range(min(timers, events)):
        state["scheduled"] += 1
        env.process(timer(env))
    started = time.perf_counter()
    env.run()
    return time.perf_counter() - started, env.now, "SimPy " + simpy.__version__


def main(argv):
    if len(argv) > 4:
        sys.exit("usage: des_hold_simpy.py [timers=1000] [events=1000000] [seed=1]")
    timers = int(argv[1]) if len(argv) > 1 else 1000
    events = int(argv[2]) if len(argv) > 2 else 1_000_000
    seed = int(argv[3]) if len(argv) > 3 else 1
    try:
        import SimPy.Simulation  # noqa: F401
        runner = run_simpy2
    except ImportError:
        runner = run_simpy3
    wall_s, end_us, version = runner(timers, events, seed)
    print(json.dumps({
        "benchmark": "des_hold", "implementation": version, "timers": timers,
        "events": events, "seed": seed, "wall_s": round(wall_s, 6),
        "events_per_s": round(events / wall_s), "final_time_us": end_us,
    }, separators=(",", ":")))


if __name__ == "__main__":
    main(sys.argv)
