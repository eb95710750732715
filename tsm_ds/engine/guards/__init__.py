"""Run guards: the divergence guard (stop or roll back before a non-finite update), the hang watchdog
(stacks, exit 6) and the stop signal (save, exit 75).
"""
