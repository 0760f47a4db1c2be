"""Events delivered to the operator's endpoints: `endpoints` (what `RELAYQ_WEBHOOKS`
names) and `sender` (signing, rendering, and delivery with retries from the store's
queue of deliveries)."""
