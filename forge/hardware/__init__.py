"""What the machine really has: hardware probes (plugins) and the check of a node description
against them."""
from forge.hardware.probe import ProbedCard, check_node_against_hardware, probe_all

__all__ = ["ProbedCard", "probe_all", "check_node_against_hardware"]
