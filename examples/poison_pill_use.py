# Use it: two producers, three consumers; the last producer to finish sends one pill each.
# A Ctrl-C while waiting sends the pills at once, so no consumer is left blocked in get().
# prints: handled 20 items; every consumer stopped
import os
import queue
import threading

from patterns.poison_pill import ProducerGroup, consume, produce_and_count_down, send_pills

q: queue.Queue[object] = queue.Queue()
group = ProducerGroup(q, producers=2, consumers=3)
handled: list[object] = []
consumers = [threading.Thread(target=consume, args=(q, handled.append)) for _ in range(3)]
for batch in (range(10), range(10, 20)):
    threading.Thread(target=produce_and_count_down, args=(q, batch, group)).start()
for consumer in consumers:
    consumer.start()
try:
    for consumer in consumers:
        consumer.join(timeout=5)
except KeyboardInterrupt:
    send_pills(q, 3)  # one more pill each is harmless: a stopped consumer takes no more
    raise
if any(consumer.is_alive() for consumer in consumers):  # would hold the exit: do not wait
    os._exit(3)
print(f"handled {len(handled)} items; every consumer stopped")
