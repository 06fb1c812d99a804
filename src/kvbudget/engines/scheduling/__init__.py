"""The scheduling kernel every engine's scheduler model stands on: requests and the readers of workloads
(`workload`), a sequence, the queues and a step (`seq`), the step-time model's interface (`timing`), and what a
simulation is asked and runs with, with the capability an engine offers to be simulated (`setup`).

It sits below the engines and above `engines.base`: it imports no engine, and nothing of the runner
(`kvbudget.simulation`), the planner or the guard that use it.
"""
