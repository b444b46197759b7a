import com.rabbitmq.client.BlockedListener;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmListener;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.MessageProperties;

import java.io.BufferedOutputStream;
import java.io.DataOutputStream;
import java.io.FileOutputStream;
import java.nio.ByteBuffer;
import java.security.MessageDigest;
import java.util.Arrays;
import java.util.NavigableSet;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicIntegerArray;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.concurrent.locks.LockSupport;

/**
 * Issue 11 load (tests/cluster/test_replication_load.py): one publisher per URI given,
 * each on its own connection and channel, publishes COUNT persistent messages of SIZE
 * random bytes to the existing queue QUEUE with streaming publisher confirms and NO
 * window: nothing ever waits for a confirm before the next publish (only the socket,
 * i.e. the broker's own back-pressure, can hold a publisher up). RATE > 0 paces each
 * publisher at RATE messages/s (still without a window); 0 is flat out.
 *
 * Body of message ID (= the channel's publish seq, 1..COUNT) of publisher K (0-based,
 * the URI's position): bytes 0-7 ID (int64 big-endian), 8-11 K (int32 big-endian), then
 * random bytes, fresh for every message.
 *
 * Writes OUTDIR/pub-K.rec, one 57-byte big-endian record per message id in order:
 * id (int64), sent (int64, epoch microseconds), settled (int64, epoch microseconds, 0 if
 * never), outcome (int8: 0 none, 1 ack, 2 nack, 3 confirmed more than once), SHA-256 of
 * the body (32 bytes). Prints {"event":"publishing","t_us":...} when publishing starts and
 * one JSON result line at the end (exit 1 on any violation: a nack, a seq never or twice
 * confirmed, a closed channel, a publisher stuck past the deadline).
 *
 * usage: RandomBodyPublisher QUEUE COUNT SIZE RATE TIMEOUT_S OUTDIR URI [URI...]
 *        TIMEOUT_S bounds publishing plus waiting for the last confirm.
 */
public final class RandomBodyPublisher {
    static final long BASE_US = System.currentTimeMillis() * 1000L;
    static final long BASE_NS = System.nanoTime();

    static long nowUs() {
        return BASE_US + (System.nanoTime() - BASE_NS) / 1000L;
    }

    public static void main(String[] args) {
        JavaTestUtil.Result r = new JavaTestUtil.Result("RandomBodyPublisher");
        try {
            run(args, r);
            r.finish();
        } catch (Throwable t) {
            r.fail(t);
        }
    }

    static final class Pub implements Runnable {
        final int k;
        final Connection conn;
        final Channel ch;
        final String queue;
        final int n;
        final int size;
        final double rate;
        final JavaTestUtil.Result r;
        final ConcurrentSkipListSet<Long> unconfirmed = new ConcurrentSkipListSet<>();
        final AtomicIntegerArray outcome;
        final AtomicLongArray settledUs;
        final long[] sentUs;
        final byte[] digests;
        final AtomicLong published = new AtomicLong();
        final AtomicInteger settled = new AtomicInteger();
        final AtomicInteger acks = new AtomicInteger();
        final AtomicInteger nacks = new AtomicInteger();
        final AtomicInteger twice = new AtomicInteger();
        final AtomicInteger confirmFrames = new AtomicInteger();
        final AtomicInteger blockedEvents = new AtomicInteger();
        volatile String error;
        volatile long publishEndUs;

        Pub(int k, Connection conn, String queue, int n, int size, double rate, JavaTestUtil.Result r)
                throws Exception {
            this.k = k;
            this.conn = conn;
            this.queue = queue;
            this.n = n;
            this.size = size;
            this.rate = rate;
            this.r = r;
            this.outcome = new AtomicIntegerArray(n + 1);
            this.settledUs = new AtomicLongArray(n + 1);
            this.sentUs = new long[n + 1];
            this.digests = new byte[32 * (n + 1)];
            conn.addBlockedListener(new BlockedListener() {
                @Override
                public void handleBlocked(String reason) { blockedEvents.incrementAndGet(); }

                @Override
                public void handleUnblocked() { }
            });
            this.ch = conn.createChannel();
            ch.confirmSelect();
            ch.addConfirmListener(new ConfirmListener() {
                @Override
                public void handleAck(long seqNo, boolean multiple) { confirm(seqNo, multiple, true); }

                @Override
                public void handleNack(long seqNo, boolean multiple) { confirm(seqNo, multiple, false); }
            });
        }

        void confirm(long seqNo, boolean multiple, boolean ack) {
            long now = nowUs();
            confirmFrames.incrementAndGet();
            if (seqNo < 1 || seqNo > published.get()) {
                r.violation("publisher " + k + ": " + (ack ? "ack" : "nack") + " for seq " + seqNo
                        + " never published (published=" + published.get() + ")");
                return;
            }
            if (multiple) {
                boolean outstanding = unconfirmed.contains(seqNo);
                NavigableSet<Long> head = unconfirmed.headSet(seqNo, true);
                Long s;
                while ((s = head.pollFirst()) != null) settle(s.intValue(), ack, now);
                if (!outstanding) again(seqNo);
            } else if (unconfirmed.remove(seqNo)) {
                settle((int) seqNo, ack, now);
            } else {
                again(seqNo);
            }
        }

        void again(long seq) {
            twice.incrementAndGet();
            outcome.set((int) seq, 3);
            r.violation("publisher " + k + ": seq " + seq + " confirmed more than once");
        }

        void settle(int seq, boolean ack, long now) {
            settledUs.set(seq, now);
            outcome.set(seq, ack ? 1 : 2);
            if (ack) acks.incrementAndGet();
            else nacks.incrementAndGet();
            settled.incrementAndGet();
        }

        @Override
        public void run() {
            try {
                MessageDigest sha = MessageDigest.getInstance("SHA-256");
                ThreadLocalRandom rnd = ThreadLocalRandom.current();
                long t0 = System.nanoTime();
                for (int i = 1; i <= n; i++) {
                    if (rate > 0) {
                        long due = t0 + (long) ((i - 1) * 1e9 / rate);
                        long wait = due - System.nanoTime();
                        if (wait > 0) LockSupport.parkNanos(wait);
                    }
                    byte[] body = new byte[size];
                    rnd.nextBytes(body);
                    ByteBuffer bb = ByteBuffer.wrap(body);
                    bb.putLong(0, i);
                    bb.putInt(8, k);
                    System.arraycopy(sha.digest(body), 0, digests, 32 * i, 32);
                    long seq = ch.getNextPublishSeqNo();
                    if (seq != i) {
                        throw new IllegalStateException("publish seq " + seq + " != message id " + i);
                    }
                    unconfirmed.add(seq);
                    published.set(seq);
                    sentUs[i] = nowUs();
                    ch.basicPublish("", queue, MessageProperties.PERSISTENT_BASIC, body);
                }
            } catch (Throwable t) {
                error = t.getClass().getName() + ": " + t.getMessage();
            } finally {
                publishEndUs = nowUs();
            }
        }

        void write(String path) throws Exception {
            try (DataOutputStream out = new DataOutputStream(new BufferedOutputStream(
                    new FileOutputStream(path), 1 << 16))) {
                for (int i = 1; i <= n; i++) {
                    out.writeLong(i);
                    out.writeLong(sentUs[i]);
                    out.writeLong(settledUs.get(i));
                    out.writeByte(outcome.get(i));
                    out.write(digests, 32 * i, 32);
                }
            }
        }
    }

    static void run(String[] args, JavaTestUtil.Result r) throws Exception {
        if (args.length < 7) {
            throw new IllegalArgumentException(
                    "usage: RandomBodyPublisher QUEUE COUNT SIZE RATE TIMEOUT_S OUTDIR URI [URI...]");
        }
        String queue = args[0];
        int n = Integer.parseInt(args[1]);
        int size = Integer.parseInt(args[2]);
        double rate = Double.parseDouble(args[3]);
        long timeoutS = Long.parseLong(args[4]);
        String outdir = args[5];
        String[] uris = Arrays.copyOfRange(args, 6, args.length);
        if (size < 12) throw new IllegalArgumentException("SIZE must be >= 12 (id + publisher number)");
        r.put("queue", queue).put("publishers", uris.length).put("messages_per_publisher", n)
                .put("size", size).put("rate_per_publisher", rate);

        Pub[] pubs = new Pub[uris.length];
        int frameMax = Integer.MAX_VALUE;
        for (int k = 0; k < uris.length; k++) {
            Connection conn = JavaTestUtil.factory(uris[k]).newConnection("mirrorq-java-random-" + k);
            pubs[k] = new Pub(k, conn, queue, n, size, rate, r);
            int fm = conn.getFrameMax();
            frameMax = Math.min(frameMax, fm == 0 ? Integer.MAX_VALUE : fm);
        }
        r.put("frame_max", frameMax == Integer.MAX_VALUE ? 0 : frameMax);
        try {
            Thread[] threads = new Thread[pubs.length];
            for (int k = 0; k < pubs.length; k++) {
                threads[k] = new Thread(pubs[k], "publisher-" + k);
                threads[k].setDaemon(true);
            }
            long t0us = nowUs();
            long t0 = System.nanoTime();
            long deadline = t0 + TimeUnit.SECONDS.toNanos(timeoutS);
            System.out.println("{\"event\":\"publishing\",\"t_us\":" + t0us + "}");
            System.out.flush();
            for (Thread t : threads) t.start();
            boolean stuck = false;
            for (int k = 0; k < threads.length; k++) {
                threads[k].join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime())));
                if (threads[k].isAlive()) {
                    stuck = true;
                    r.violation("publisher " + k + " still publishing at the deadline (" + timeoutS
                            + " s): published " + pubs[k].published.get() + " of " + n
                            + " (blocked in basicPublish: the broker stopped reading?)");
                }
            }
            long tPublished = System.nanoTime();
            long total = (long) n * pubs.length;
            while (System.nanoTime() < deadline) {
                long settled = 0;
                boolean open = true;
                for (Pub p : pubs) {
                    settled += p.settled.get();
                    open &= p.ch.isOpen();
                }
                if (settled >= total || !open) break;
                Thread.sleep(2);
            }
            long t1 = System.nanoTime();
            double elapsedMs = (t1 - t0) / 1e6;
            long acked = 0, nacked = 0, never = 0, twice = 0, blocked = 0;
            long[] lat = new long[(int) total];
            int m = 0;
            for (Pub p : pubs) {
                String pre = "p" + p.k + "_";
                int pn = 0, pt = 0;
                for (int i = 1; i <= n; i++) {
                    int o = p.outcome.get(i);
                    if (o == 0) pn++;
                    if (o == 3) pt++;
                    long s = p.settledUs.get(i);
                    if (s > 0 && p.sentUs[i] > 0) lat[m++] = s - p.sentUs[i];
                }
                r.put(pre + "published", p.published.get()).put(pre + "acked", p.acks.get())
                        .put(pre + "nacked", p.nacks.get()).put(pre + "never_confirmed", pn)
                        .put(pre + "confirm_frames", p.confirmFrames.get())
                        .put(pre + "blocked_events", p.blockedEvents.get())
                        .put(pre + "publish_ms", JavaTestUtil.round2((p.publishEndUs - t0us) / 1e3));
                acked += p.acks.get();
                nacked += p.nacks.get();
                never += pn;
                twice += pt;
                blocked += p.blockedEvents.get();
                if (p.error != null) r.violation("publisher " + p.k + " failed: " + p.error);
                if (!p.ch.isOpen()) r.violation("publisher " + p.k + " channel closed: " + p.ch.getCloseReason());
                if (p.nacks.get() > 0) r.violation("publisher " + p.k + ": " + p.nacks.get() + " publishes nacked");
                if (pn > 0) {
                    r.violation("publisher " + p.k + ": " + pn + " of " + n + " publishes never confirmed within "
                            + timeoutS + " s (first outstanding seq "
                            + (p.unconfirmed.isEmpty() ? "?" : p.unconfirmed.first()) + ")");
                }
                p.write(outdir + "/pub-" + p.k + ".rec");
            }
            Arrays.sort(lat, 0, m);
            r.put("acked", acked).put("nacked", nacked).put("never_confirmed", never)
                    .put("confirmed_more_than_once", twice).put("blocked_events", blocked)
                    .put("stuck", stuck)
                    .put("publish_ms", JavaTestUtil.round2((tPublished - t0) / 1e6))
                    .put("elapsed_ms", JavaTestUtil.round2(elapsedMs))
                    .put("msg_per_s", JavaTestUtil.round2(acked / (elapsedMs / 1000.0)))
                    .put("mib_per_s", JavaTestUtil.round2(acked * (double) size / (1 << 20) / (elapsedMs / 1000.0)))
                    .put("confirm_p50_ms", JavaTestUtil.round2(JavaTestUtil.percentile(lat, m, 50) / 1e3))
                    .put("confirm_p99_ms", JavaTestUtil.round2(JavaTestUtil.percentile(lat, m, 99) / 1e3))
                    .put("confirm_max_ms", JavaTestUtil.round2(m > 0 ? lat[m - 1] / 1e3 : 0));
        } finally {
            // a publisher stuck in a socket write holds the connection's write lock, so a
            // graceful close would hang: then leave the sockets to the exit
            boolean stuck = false;
            for (Pub p : pubs) stuck |= p != null && p.publishEndUs == 0;
            for (Pub p : pubs) {
                if (p == null || stuck) continue;
                try { p.conn.close(5000); } catch (Exception ignored) { }
            }
        }
    }
}
