"""The shape-aware broker: one queue per node, batches shaped to each engine's contract.

A pure core (BrokerCore: geometry, prefix groups, batch forming, dispatch choice) and an asyncio
wrapper (Broker) with bounded queues and back-pressure. docs/broker.md explains the model."""
from forge.broker.core import BrokerCore
from forge.broker.queue import Broker
from forge.broker.geometry import size_problem
from forge.broker.types import (
    BrokerClosed,
    BrokerRequest,
    EngineGeometry,
    NoEngineFits,
    QueueFull,
    blocks_for,
    blocks_needed,
)

__all__ = [
    "Broker",
    "BrokerCore",
    "BrokerClosed",
    "BrokerRequest",
    "EngineGeometry",
    "NoEngineFits",
    "QueueFull",
    "blocks_for",
    "blocks_needed",
    "size_problem",
]
