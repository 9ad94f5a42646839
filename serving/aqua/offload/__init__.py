"""KV offload for preempted requests: where a victim's KV goes (lent region, DRAM) and how it is
gathered into one contiguous buffer (the "Aqua tensor") and scattered back."""
