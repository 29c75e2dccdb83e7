"""How long the core waits before it looks at a node again: every recheck interval, named once.

The state machine (:mod:`healer.core.machine`) and the guardrails (:mod:`healer.core.budget`)
both schedule rechecks; these are the waits neither a policy nor a deadline sets. Seconds.
"""

from __future__ import annotations

#: A node a guardrail holds back (maxConcurrent, maxUnavailable, a failure domain, Slurm's
#: state unknown) asks for admission again after this long.
GUARDRAIL_RECHECK = 30.0

#: A paused node (``healer.io/paused``) is looked at again after this long.
PAUSED_RECHECK = 60.0

#: A node held for capacity asks the spare pool again after this long when no spare appeared
#: (a spare appearing wakes it at once; this tick is only a backstop).
HELD_RETRY = 300.0

#: The longest wait before a step that failed transiently is tried again.
MAX_BACKOFF = 300.0
