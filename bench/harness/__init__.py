"""The benchmark harness: what every experiment under bench/ shares.

  network   where ranks live: the emulated cluster (bench/cluster/cluster.sh), loopbacks; byte counters
  wan       the emulated WAN (TUN devices joined by gradex-delayline): hosts' rates, delays, regions,
            loss, MTU by rate and TCP cubic by default
  launcher  one rank launcher: P processes on a network, bounded in time, progress and wire bytes
  machine   what machine a run used
  results   the result schema: every result file records its command, commit, machine and link
  plot      one plotting module: every figure under docs/ is drawn by it
  tables    the docs' Markdown tables, rendered from stored result files

Experiments (bench/experiments/, bench/train/, bench/cluster/*_suite.py, bench/lm/, ...) run as modules
of the bench package from the repository root, e.g. `python -m bench.experiments.wan_rtt`; bench/run
does that for the suites. A new experiment goes in bench/experiments/ as a module with a main(): it builds its
network with network.py or wan.py, starts ranks with launcher.run_ranks, writes its results with
results.write and draws with plot (wan_rtt.py is the example).
"""
