"""What the commands share above the engine: plan.py turns the options a user gave (by name) into
a validated run or serve plan, a loaded engine and a finished generation. ``cactus-gguf run`` and
``serve`` (cli/) and the benchmark (bench/) build on it; the engine knows nothing of it."""
