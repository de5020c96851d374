"""Message-queue provider for ``MessageQueueTrigger(scheme="nats-cg")`` (common-messaging)."""
