"""What every Ray Train worker runs: the loop (``loop.py``), what it builds first (``building.py``), where a run starts
from (``resuming.py``), what it saves (``saving.py``), the step, DDP or FSDP2, the sampler and loaders, exact metrics,
checkpoints, fine-tuning's frozen modules; Lightning's loop."""
