"""The plan: what a profile costs on a cluster before it runs (torch-free): sizes, rates, packing,
makespan, billing, the preflight checks and the dry run."""
