import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Envelope;
import com.rabbitmq.client.MessageProperties;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.TreeSet;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * S04/S05/S07 (+S01, S09): one consumer with manual acks and basic.qos(prefetch).
 *
 *  1. the first `prefetch` deliveries fill the window; no further push arrives
 *     while they are unacked (S09); all have redelivered=false (S07);
 *  2. basic.ack(tag=ackFirst, multiple=true) then
 *     basic.nack(tag=prefetch, multiple=true, requeue=true): the first ackFirst
 *     are settled, the rest of the window is requeued and must come back with
 *     redelivered=true (and the acked ones must not come back);
 *  3. everything else is acked with basic.ack(multiple=true) in batches;
 *  4. afterwards every message was settled exactly once: ids 1..ackFirst and the
 *     never-nacked ones delivered once, the nacked ones exactly twice; no extra
 *     deliveries, queue empty.
 *
 * usage: ManualAckNack URI [count=500] [prefetch=50] [ackFirst=10] [timeoutSeconds=60]
 */
public final class ManualAckNack {
    public static void main(String[] args) {
        JavaTestUtil.Result r = new JavaTestUtil.Result("ManualAckNack");
        try {
            run(args, r);
            r.finish();
        } catch (Throwable t) {
            r.fail(t);
        }
    }

    static final class Delivery {
        final long tag; final int id; final boolean redelivered; final int phase;
        Delivery(long tag, int id, boolean redelivered, int phase) {
            this.tag = tag; this.id = id; this.redelivered = redelivered; this.phase = phase;
        }
    }

    static void run(String[] args, JavaTestUtil.Result r) throws Exception {
        String uri = args[0];
        final int n = args.length > 1 ? Integer.parseInt(args[1]) : 500;
        final int prefetch = args.length > 2 ? Integer.parseInt(args[2]) : 50;
        final int ackFirst = args.length > 3 ? Integer.parseInt(args[3]) : 10;
        long timeoutS = args.length > 4 ? Long.parseLong(args[4]) : 60;
        final int batch = Math.max(1, Math.min(10, prefetch / 2));
        if (!(0 < ackFirst && ackFirst < prefetch && prefetch < n)) {
            throw new IllegalArgumentException("need 0 < ackFirst < prefetch < count");
        }
        final int nackCount = prefetch - ackFirst;
        final int expectedDeliveries = n + nackCount;
        r.put("messages", n).put("prefetch", prefetch).put("ack_first", ackFirst).put("nacked", nackCount);

        Connection conn = JavaTestUtil.factory(uri).newConnection("mirrorq-java-acknack");
        try {
            Channel pub = conn.createChannel();
            String queue = "java-acknack-" + UUID.randomUUID().toString().substring(0, 12);
            pub.queueDeclare(queue, true, false, false, null);
            r.put("queue", queue);
            pub.confirmSelect();
            byte[] body = new byte[256];
            for (int i = 1; i <= n; i++) {
                ByteBuffer.wrap(body).putLong(0, i);
                pub.basicPublish("", queue, MessageProperties.PERSISTENT_BASIC, body);
            }
            pub.waitForConfirmsOrDie(30_000);

            final Object lock = new Object();
            final List<Delivery> log = new ArrayList<>();
            final TreeSet<Long> unacked = new TreeSet<>();
            final long[] lastTag = {0};
            final int[] phase = {0};               // 0: first window, 1: after the nack
            final boolean[] released = {false};    // main thread sent its nack/ack
            final int[] sinceAck = {0};
            final int[] maxUnacked = {0};
            final CountDownLatch windowFull = new CountDownLatch(1);
            final CountDownLatch done = new CountDownLatch(1);

            final Channel ch = conn.createChannel();
            ch.basicQos(prefetch);
            long t0 = System.nanoTime();
            String ctag = ch.basicConsume(queue, false, new DefaultConsumer(ch) {
                @Override
                public void handleDelivery(String consumerTag, Envelope env, AMQP.BasicProperties props,
                                           byte[] b) throws IOException {
                    long tag = env.getDeliveryTag();
                    int id = b.length >= 8 ? (int) ByteBuffer.wrap(b).getLong(0) : -1;
                    synchronized (lock) {
                        if (tag != lastTag[0] + 1) r.violation("delivery tag " + tag + " after " + lastTag[0] + " (S01)");
                        lastTag[0] = tag;
                        log.add(new Delivery(tag, id, env.isRedeliver(), phase[0]));
                        unacked.add(tag);
                        if (unacked.size() > prefetch) {
                            r.violation(unacked.size() + " unacked deliveries with prefetch " + prefetch + " (S09)");
                        }
                        maxUnacked[0] = Math.max(maxUnacked[0], unacked.size());
                        if (phase[0] == 0) {
                            if (log.size() == prefetch) windowFull.countDown();
                            return;
                        }
                        sinceAck[0]++;
                        if (released[0]) maybeAck();
                    }
                }

                // called with lock held
                private void maybeAck() throws IOException {
                    boolean last = log.size() >= expectedDeliveries;
                    if ((sinceAck[0] >= batch || last) && !unacked.isEmpty()) {
                        ch.basicAck(lastTag[0], true);
                        unacked.headSet(lastTag[0], true).clear();
                        sinceAck[0] = 0;
                    }
                    if (last) done.countDown();
                }
            });

            long wDeadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(timeoutS);
            while (!windowFull.await(100, TimeUnit.MILLISECONDS) && System.nanoTime() < wDeadline && ch.isOpen()) { }
            if (windowFull.getCount() > 0) {
                if (!ch.isOpen()) r.violation("consumer channel closed: " + ch.getCloseReason());
                synchronized (lock) {
                    r.violation("first window: only " + log.size() + " of prefetch=" + prefetch + " delivered");
                }
                throw new IllegalStateException("first prefetch window never filled");
            }
            Thread.sleep(300); // S09: nothing more may arrive while the window is full
            synchronized (lock) {
                r.put("first_window", log.size());
                if (log.size() != prefetch) {
                    r.violation("got " + log.size() + " deliveries with prefetch " + prefetch
                            + " and nothing acked (S09)");
                }
                long ackTag = log.get(ackFirst - 1).tag;
                long nackTag = log.get(prefetch - 1).tag;
                phase[0] = 1;
                // ack multiple up to ackFirst, then nack multiple up to the end of the
                // window: the nack covers only what is still outstanding (S05).
                ch.basicAck(ackTag, true);
                unacked.headSet(ackTag, true).clear();
                ch.basicNack(nackTag, true, true);
                unacked.headSet(nackTag, true).clear();
                released[0] = true;
                // deliveries that arrived while we held nothing back are acked by the
                // consumer; if every delivery is already in, settle it here.
                if (log.size() >= expectedDeliveries) {
                    ch.basicAck(lastTag[0], true);
                    unacked.clear();
                    done.countDown();
                }
            }

            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(timeoutS);
            boolean all = false;
            while (!(all = done.await(100, TimeUnit.MILLISECONDS)) && System.nanoTime() < deadline) {
                if (!ch.isOpen()) break;
            }
            double ms = (System.nanoTime() - t0) / 1e6;
            Thread.sleep(500); // extra (duplicate) deliveries would show up here
            if (ch.isOpen()) ch.basicCancel(ctag);
            else r.violation("consumer channel closed: " + ch.getCloseReason());

            synchronized (lock) {
                r.put("deliveries", log.size()).put("expected_deliveries", expectedDeliveries);
                r.put("max_unacked", maxUnacked[0]);
                r.put("elapsed_ms", JavaTestUtil.round2(ms));
                if (!all) r.violation("only " + log.size() + " of " + expectedDeliveries + " deliveries");
                if (log.size() > expectedDeliveries) r.violation((log.size() - expectedDeliveries) + " extra deliveries");

                boolean[] nacked = new boolean[n + 1];
                boolean[] ackedFirst = new boolean[n + 1];
                for (int i = 0; i < prefetch && i < log.size(); i++) {
                    Delivery d = log.get(i);
                    if (d.id < 1 || d.id > n) continue;
                    if (i < ackFirst) ackedFirst[d.id] = true; else nacked[d.id] = true;
                }
                List<List<Delivery>> byId = new ArrayList<>();
                for (int i = 0; i <= n; i++) byId.add(new ArrayList<>());
                for (Delivery d : log) {
                    if (d.id < 1 || d.id > n) { r.violation("unknown message id " + d.id); continue; }
                    byId.get(d.id).add(d);
                }
                int redeliveredSeen = 0, lost = 0, dup = 0;
                for (int id = 1; id <= n; id++) {
                    List<Delivery> ds = byId.get(id);
                    int want = nacked[id] ? 2 : 1;
                    if (ds.isEmpty()) { lost++; r.violation("message " + id + " never delivered"); continue; }
                    if (ds.size() > want) { dup++; r.violation("message " + id + " delivered " + ds.size() + " times, expected " + want); }
                    if (ds.size() < want) { lost++; r.violation("nacked message " + id + " was not redelivered"); }
                    if (ds.get(0).redelivered) r.violation("first delivery of " + id + " has redelivered=true (S07)");
                    for (int k = 1; k < ds.size(); k++) {
                        if (ds.get(k).redelivered) redeliveredSeen++;
                        else r.violation("re-delivery of " + id + " has redelivered=false (S04/S07)");
                    }
                    if (ackedFirst[id] && ds.size() > 1) r.violation("message " + id + " acked via multiple=true yet redelivered (S05)");
                }
                r.put("redelivered_true", redeliveredSeen).put("lost", lost).put("duplicated", dup);
                if (redeliveredSeen != nackCount) {
                    r.violation(redeliveredSeen + " deliveries with redelivered=true, expected " + nackCount);
                }
            }
            int left = pub.queueDeclarePassive(queue).getMessageCount();
            r.put("ready_after", left);
            if (left != 0) r.violation(left + " messages still ready after everything was acked");
            pub.queueDelete(queue);
        } finally {
            try { conn.close(5000); } catch (Exception ignored) { }
        }
    }
}
