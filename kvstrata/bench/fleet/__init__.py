"""`kvstrata bench fleet`: an agent fleet sharing one prefix behind data-parallel ranks, per routing policy
(workload.py: the sessions and the figures; command.py: the servers and the run)."""
