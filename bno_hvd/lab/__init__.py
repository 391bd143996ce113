"""THE LABORATORY around the method: slow ranks made on purpose, and the measurements of what
the strategies do with them. May import :mod:`bno_hvd.common`, :mod:`bno_hvd.allocation`,
:mod:`bno_hvd.data`, :mod:`bno_hvd.processes`, :mod:`bno_hvd.library` and
:mod:`bno_hvd.training`; never the CLI. Nothing in the production path
imports the lab: its behaviour enters a run through :mod:`.plugin`.

- :mod:`.plugin` - the lab's way into a run (hooks for the flags below)
- :mod:`.emulation` - EMULATED slow devices (``--emulate-speed``, ``--emulate-schedule``)
- :mod:`.cpuquota` - REAL slow ranks: a cgroup per rank with a CPU quota, and its reaper
- :mod:`.heterogeneity` - what makes a run's ranks differ, and its EMULATED / REAL label
- :mod:`.gpushares` - REAL GPU heterogeneity: ranks sharing one GPU (MPS shares, or GPU beside CPU ranks)
- :mod:`.faults` - injected faults for the reliability tests
- :mod:`.suites` - several runs in one job: ``bench``, ``experiment`` and ``time-to-accuracy``
- :mod:`.ttastats` - ``time-to-accuracy``: the MLPerf mean (without fastest and slowest), its table
- :mod:`.profiles`, :mod:`.confine`, :mod:`.suitetable` - ``bench --suite real``: profiles, confinement, tables
- :mod:`.elasticreal` - the REAL elastic profile (``benchmarks/elastic_real.py``): a slow rank
  leaves, a fast one joins, every worker in a cgroup set outside bno-hvd
- :mod:`.shares` - whether ranks with one CPU limit get one share (a suite's ``balanced`` updates)
- :mod:`.benchstats` - benchmark arithmetic (throughput, of ideal, recovery, breakdowns)
- :mod:`.engines` - the torch engine beside the Horovod engine: paired suite runs, one table
- :mod:`.pairing`, :mod:`.stalls` - ``bench --rounds``: paired ratios; single updates that stalled, and why
- :mod:`.textbench` - ``bench --dataset text``: strategy:unit entries, tokens/s, perplexity
- :mod:`.averages` - the paper's evaluation arithmetic (averages per block, time to accuracy)
- :mod:`.logread`, :mod:`.report`, :mod:`.plots` - reading run logs, writing reports and figures
- :mod:`.stamps`, :mod:`.userscripts` - a user's own script timed from outside against its plain twin
  (``benchmarks/dropin_real.py``)
- :mod:`.gpucheck`, :mod:`.gpuparts`, :mod:`.gpuprobe`, :mod:`.gpureport` - the GPU check
  (``launch/gpu-check OUT``): parts with budgets on a lent GPU machine, and its report
- :mod:`.sim` - a simulator of the update for allocation policies (``bno-hvd simulate``)
"""
