import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmListener;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Envelope;
import com.rabbitmq.client.MessageProperties;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.NavigableSet;
import java.util.UUID;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicIntegerArray;
import java.util.concurrent.atomic.AtomicLong;

/**
 * S14/S15 (+S18/S21 context): publish N persistent messages to a durable queue
 * with streaming publisher confirms, tracking unconfirmed sequence numbers in a
 * sorted set, and check that every sequence number is acked or nacked exactly
 * once. Then drain the queue with manual acks and check nothing confirmed is
 * missing and nothing is duplicated.
 *
 * usage: ConfirmsStreaming URI [count=10000] [size=1024] [timeoutSeconds=120]
 */
public final class ConfirmsStreaming {
    public static void main(String[] args) {
        JavaTestUtil.Result r = new JavaTestUtil.Result("ConfirmsStreaming");
        try {
            run(args, r);
            r.finish();
        } catch (Throwable t) {
            r.fail(t);
        }
    }

    static void run(String[] args, JavaTestUtil.Result r) throws Exception {
        String uri = args[0];
        final int n = args.length > 1 ? Integer.parseInt(args[1]) : 10_000;
        int size = args.length > 2 ? Integer.parseInt(args[2]) : 1024;
        long timeoutS = args.length > 3 ? Long.parseLong(args[3]) : 120;
        r.put("messages", n).put("size", size);

        Connection conn = JavaTestUtil.factory(uri).newConnection("mirrorq-java-confirms");
        try {
            Channel ch = conn.createChannel();
            String queue = "java-confirms-" + UUID.randomUUID().toString().substring(0, 12);
            ch.queueDeclare(queue, true, false, false, null);
            r.put("queue", queue);

            // ---- publish with streaming confirms -------------------------------------
            final ConcurrentSkipListSet<Long> unconfirmed = new ConcurrentSkipListSet<>();
            final AtomicIntegerArray confirmCount = new AtomicIntegerArray(n + 1);
            final AtomicIntegerArray nackedSeq = new AtomicIntegerArray(n + 1);
            final long[] sentAt = new long[n + 1];
            final long[] latency = new long[n + 1];
            final AtomicInteger settled = new AtomicInteger();
            final AtomicInteger acks = new AtomicInteger();
            final AtomicInteger nacks = new AtomicInteger();
            final AtomicInteger ackFrames = new AtomicInteger();
            final AtomicInteger multipleFrames = new AtomicInteger();
            final AtomicLong published = new AtomicLong();

            ch.confirmSelect();
            ch.addConfirmListener(new ConfirmListener() {
                @Override
                public void handleAck(long seqNo, boolean multiple) { confirm(seqNo, multiple, true); }

                @Override
                public void handleNack(long seqNo, boolean multiple) { confirm(seqNo, multiple, false); }

                private void confirm(long seqNo, boolean multiple, boolean ack) {
                    long now = System.nanoTime();
                    ackFrames.incrementAndGet();
                    String kind = ack ? "ack" : "nack";
                    if (seqNo < 1 || seqNo > published.get()) {
                        r.violation(kind + " for seq " + seqNo + " which was never published (published="
                                + published.get() + ")");
                        return;
                    }
                    if (multiple) {
                        multipleFrames.incrementAndGet();
                        boolean tagOutstanding = unconfirmed.contains(seqNo);
                        NavigableSet<Long> head = unconfirmed.headSet(seqNo, true);
                        Long s;
                        while ((s = head.pollFirst()) != null) settle(s, ack, now);
                        if (!tagOutstanding) {
                            confirmCount.incrementAndGet((int) seqNo);
                            r.violation("multiple " + kind + " for seq " + seqNo
                                    + " which was already confirmed (confirmed twice)");
                        }
                    } else {
                        if (unconfirmed.remove(seqNo)) {
                            settle(seqNo, ack, now);
                        } else {
                            confirmCount.incrementAndGet((int) seqNo);
                            r.violation(kind + " for seq " + seqNo + " which was already confirmed (confirmed twice)");
                        }
                    }
                }

                private void settle(long seq, boolean ack, long now) {
                    int i = (int) seq;
                    confirmCount.incrementAndGet(i);
                    latency[i] = now - sentAt[i];
                    if (ack) acks.incrementAndGet();
                    else { nacks.incrementAndGet(); nackedSeq.set(i, 1); }
                    settled.incrementAndGet();
                }
            });

            byte[] body = new byte[size];
            Arrays.fill(body, (byte) 'x');
            long t0 = System.nanoTime();
            for (int i = 1; i <= n; i++) {
                long seq = ch.getNextPublishSeqNo();
                if (seq != i) {
                    r.violation("client publish seq " + seq + " != expected " + i);
                }
                ByteBuffer.wrap(body).putLong(0, seq);
                sentAt[i] = System.nanoTime();
                published.set(seq);
                unconfirmed.add(seq);
                ch.basicPublish("", queue, MessageProperties.PERSISTENT_BASIC, body);
            }
            long tPublished = System.nanoTime();
            long deadline = tPublished + TimeUnit.SECONDS.toNanos(timeoutS);
            while (settled.get() < n && System.nanoTime() < deadline && ch.isOpen()) {
                Thread.sleep(2);
            }
            long t1 = System.nanoTime();
            double elapsedMs = (t1 - t0) / 1e6;
            r.put("publish_ms", JavaTestUtil.round2((tPublished - t0) / 1e6));
            r.put("elapsed_ms", JavaTestUtil.round2(elapsedMs));
            r.put("msg_per_s", JavaTestUtil.round2(n / (elapsedMs / 1000.0)));
            r.put("acked", acks.get()).put("nacked", nacks.get());
            r.put("confirm_frames", ackFrames.get()).put("multiple_frames", multipleFrames.get());
            if (!ch.isOpen()) {
                r.violation("confirm channel closed: " + ch.getCloseReason());
            }
            if (settled.get() < n) {
                r.violation((n - settled.get()) + " of " + n + " publishes never confirmed within " + timeoutS
                        + " s (first unconfirmed seq " + (unconfirmed.isEmpty() ? "?" : unconfirmed.first()) + ")");
            }
            int twice = 0, never = 0;
            for (int i = 1; i <= n; i++) {
                int c = confirmCount.get(i);
                if (c == 0) never++;
                else if (c > 1) twice++;
            }
            r.put("never_confirmed", never).put("confirmed_more_than_once", twice);
            if (twice > 0) r.violation(twice + " seqs confirmed more than once");

            long[] lat = new long[n];
            int m = 0;
            for (int i = 1; i <= n; i++) if (confirmCount.get(i) > 0) lat[m++] = latency[i];
            Arrays.sort(lat, 0, m);
            r.put("confirm_p50_ms", JavaTestUtil.round2(JavaTestUtil.percentile(lat, m, 50) / 1e6));
            r.put("confirm_p99_ms", JavaTestUtil.round2(JavaTestUtil.percentile(lat, m, 99) / 1e6));
            r.put("confirm_max_ms", JavaTestUtil.round2(m > 0 ? lat[m - 1] / 1e6 : 0));

            // ---- drain with manual acks ---------------------------------------------
            if (!ch.isOpen()) ch = conn.createChannel();
            final int ready = ch.queueDeclarePassive(queue).getMessageCount();
            r.put("ready_after_confirms", ready);
            if (ready < acks.get() || ready > n) {
                r.violation("queue holds " + ready + " messages after confirms; expected between acked="
                        + acks.get() + " and published=" + n);
            }
            Channel cch = conn.createChannel();
            cch.basicQos(500);
            final int expected = Math.max(ready, acks.get());
            final AtomicIntegerArray seen = new AtomicIntegerArray(n + 1);
            final AtomicInteger delivered = new AtomicInteger();
            final AtomicLong lastTag = new AtomicLong();
            final CountDownLatch done = new CountDownLatch(1);
            long c0 = System.nanoTime();
            String ctag = cch.basicConsume(queue, false, new DefaultConsumer(cch) {
                @Override
                public void handleDelivery(String consumerTag, Envelope env, AMQP.BasicProperties props,
                                           byte[] b) throws IOException {
                    long tag = env.getDeliveryTag();
                    long prev = lastTag.getAndSet(tag);
                    if (tag != prev + 1) r.violation("delivery tag " + tag + " after " + prev + " (S01)");
                    if (env.isRedeliver()) r.violation("first delivery has redelivered=true (tag " + tag + ")");
                    long id = b.length >= 8 ? ByteBuffer.wrap(b).getLong(0) : -1;
                    if (id < 1 || id > n) {
                        r.violation("delivered a message with unknown id " + id);
                    } else if (seen.incrementAndGet((int) id) > 1) {
                        r.violation("message " + id + " delivered more than once");
                    }
                    if (b.length != size) r.violation("message " + id + " has body length " + b.length);
                    int c = delivered.incrementAndGet();
                    if (c % 100 == 0 || c >= expected) {
                        getChannel().basicAck(tag, true);
                    }
                    if (c == expected) done.countDown();
                }
            });
            long cDeadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(timeoutS);
            boolean all = false;
            while (!(all = done.await(100, TimeUnit.MILLISECONDS)) && System.nanoTime() < cDeadline) {
                if (!cch.isOpen()) {
                    r.violation("consumer channel closed while draining: " + cch.getCloseReason());
                    break;
                }
            }
            double consumeMs = (System.nanoTime() - c0) / 1e6;
            Thread.sleep(300); // any extra (duplicate) delivery would show up here
            if (cch.isOpen()) cch.basicCancel(ctag);
            r.put("consumed", delivered.get());
            r.put("consume_ms", JavaTestUtil.round2(consumeMs));
            r.put("consume_msg_per_s", JavaTestUtil.round2(delivered.get() / (consumeMs / 1000.0)));
            if (!all) r.violation("consumed only " + delivered.get() + " of " + expected);
            if (delivered.get() > expected) r.violation("consumed " + delivered.get() + " > " + expected + " ready");
            int lost = 0;
            for (int i = 1; i <= n; i++) {
                if (confirmCount.get(i) > 0 && nackedSeq.get(i) == 0 && seen.get(i) == 0) lost++;
            }
            r.put("acked_but_not_consumed", lost);
            if (lost > 0) r.violation(lost + " confirmed (acked) messages were never delivered");
            int left = ch.queueDeclarePassive(queue).getMessageCount();
            r.put("ready_after_drain", left);
            if (left != 0) r.violation(left + " messages still ready after draining");
            ch.queueDelete(queue);
        } finally {
            try { conn.close(5000); } catch (Exception ignored) { }
        }
    }
}
