"""Microbenchmarks under mpiexec: `collectives bench` (nccl-tests / OSU tables, MPI side by side, simulator
predictions) and `collectives calibrate` (this host's numbers, written as a loopback topology).

- sizes.py: K/M/G sizes and nccl-tests' size sweep (-b/-e/-f/-i);
- data.py: deterministic per-rank inputs, their exact reference results and the #wrong count;
- format.py: the nccl-tests and OSU table layouts;
- runner.py: the measurement loop behind `collectives bench`;
- calibrate.py: the measurements behind `collectives calibrate` and the loopback topology they make.
"""
