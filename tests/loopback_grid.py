"""A Flower Grid in this process, for tests of what runs over Flower."""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, Message, RecordDict

NodeApp = Callable[[Message, Context], Message]  # a ClientApp, or anything called like one


class LoopbackGrid:
    """A Grid that hands each message straight to its node's ClientApp, in this process.

    Only Flower's transport is missing: the ClientApp, its Context state and the party
    workers are the real ones, so relay failures can be staged cheaply.
    """

    def __init__(self, app: NodeApp, node_ids: list[int], run_id: int = 7) -> None:
        self.app = app
        self.contexts = {node: Context(run_id=run_id, node_id=node, node_config={},
                                       state=RecordDict(), run_config={})
                         for node in node_ids}
        self.replies: dict[str, Message] = {}
        self.pushes = 0
        self.before_push: Callable[[int], None] = lambda pushes: None

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: list[Message]) -> list[str]:
        self.pushes += 1
        self.before_push(self.pushes)
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message.object_id
            message.metadata.__dict__["_run_id"] = 7
            context = self.contexts[message.metadata.dst_node_id]
            self.replies[message.metadata.message_id] = self.app(message, context)
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: list[str]) -> list[Message]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]
