import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmListener;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Envelope;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.BitSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.NavigableSet;
import java.util.Random;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.UUID;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

/**
 * mirrorq load generator (RabbitMQ Java client). One JSON line on stdout.
 *
 *   Bench --uri URI --mode confirms --count 10000 --size 1024 --window 5000 --publishers 1
 *   Bench --uri URI --mode confirms --count 50000 --window 0          (0 = no window, unbounded)
 *   Bench --uri URI --mode publish  --count 200000 --threads 2        (no confirms, N connections)
 *   Bench --uri URI --mode tx       --count 2000  --size 1024
 *   Bench --uri URI --mode consume  --queue Q [--count N] --prefetch 1000 --ack-every 100 [--auto-ack]
 *         [--verify] [--allow-redelivered K]   (compare every body with what was published;
 *         accept up to K redeliveries, e.g. a probe's basic.get returned unacked)
 *   Bench --uri URI --mode latency  --rate 2000 --duration 10 --warmup-seconds 2 --prefetch 100
 *
 * Common: --queue NAME (default: a fresh durable queue), --keep (do not delete the
 * queue afterwards; default for confirms/tx/publish/latency is to delete unless --keep),
 * --declare-uri URI (declare the queue and read its depth over a connection to this URI,
 * e.g. another cluster node, so the queue leader is placed there; default --uri),
 * --queue-type T (declare with x-queue-type=T, e.g. quorum; default: no arguments),
 * --warmup N (confirms/publish/tx/latency: first publish N untimed confirmed messages to a
 * throwaway queue so the JVM is warm), --timeout SECONDS (stall timeout, default 120),
 * --transient (non-persistent), --publisher-offset P (confirms: number the publishers from P,
 * for ids and payload seeds, so several runs into one queue never repeat an id),
 * --check-depth (confirms: the queue must hold exactly --count messages afterwards; only
 * for a queue nobody else publishes to).
 *
 * Payload (confirms/publish/tx/latency): --payload random (default) sends, per publisher, a
 * pool of --payload-pool (default 256) DISTINCT bodies of --size bytes filled from a
 * SplittableRandom seeded with --payload-seed (default 42) + the publisher index (repeatable),
 * cycled per publish: 256 x 1 KiB = 256 KiB, far beyond zlib's 32 KiB window, so a transport
 * that compresses gains nothing, as with real (already compressed or encrypted) payloads. The
 * pool is capped at 16 MiB (but at least 2 bodies). --payload compressible sends one random
 * block (java.util.Random(42)) again and again, the generator's behaviour before: zlib shrinks
 * a batch of those about 100x.
 *
 * Every message body starts with an 8-byte id ((publisher index << 32) | per-publisher
 * sequence number) so consumers can check that each message arrives exactly once; latency
 * mode adds the publish time (System.nanoTime) in bytes 8..15 and the scheduled time in
 * bytes 16..23. Bodies are at least 24 bytes.
 * Exit status 0 when every message was confirmed/committed/consumed exactly once, else 1.
 */
public final class Bench {
    static final Map<String, String> opts = new HashMap<>();

    static String opt(String k, String def) { return opts.getOrDefault(k, def); }
    static int optInt(String k, int def) { return Integer.parseInt(opt(k, String.valueOf(def))); }
    static double optDouble(String k, double def) { return Double.parseDouble(opt(k, String.valueOf(def))); }
    static boolean flag(String k) { return opts.containsKey(k); }

    static final int MIN_BODY = 24;

    public static void main(String[] args) {
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (!a.startsWith("--")) { System.err.println("bad argument " + a); System.exit(2); }
            String k = a.substring(2);
            if (i + 1 < args.length && !args[i + 1].startsWith("--")) opts.put(k, args[++i]);
            else opts.put(k, "true");
        }
        Out out = new Out();
        try {
            String mode = opt("mode", "confirms");
            out.put("mode", mode);
            switch (mode) {
                case "confirms": confirms(out); break;
                case "publish": publish(out); break;
                case "tx": tx(out); break;
                case "consume": consume(out); break;
                case "latency": latency(out); break;
                default: throw new IllegalArgumentException("unknown --mode " + mode);
            }
        } catch (Throwable t) {
            out.put("error", describe(t));
        }
        out.put("sanity_ok", !out.fields.containsKey("error"));
        System.out.println(out.json());
        System.out.flush();
        System.exit(out.fields.containsKey("error") ? 1 : 0);
    }

    // ------------------------------------------------------------------ helpers

    /** Exception with its cause chain (the Java client wraps channel/connection closes). */
    static String describe(Throwable t) {
        StringBuilder sb = new StringBuilder();
        for (Throwable c = t; c != null && sb.length() < 2000; c = c.getCause()) {
            if (sb.length() > 0) sb.append(" <- ");
            sb.append(c.getClass().getSimpleName()).append(": ").append(c.getMessage());
            if (c.getCause() == c) break;
        }
        return sb.toString();
    }

    static ConnectionFactory factory(String uri) throws Exception {
        ConnectionFactory cf = new ConnectionFactory();
        cf.setUri(uri);
        if (cf.getVirtualHost() == null || cf.getVirtualHost().isEmpty()) cf.setVirtualHost("/");
        cf.setAutomaticRecoveryEnabled(false);
        cf.setConnectionTimeout(10_000);
        cf.setRequestedHeartbeat(60);
        return cf;
    }

    static ConnectionFactory factory() throws Exception {
        return factory(opt("uri", "amqp://guest:guest@127.0.0.1:5672/%2F"));
    }

    /** Connection for declares and depth checks (--declare-uri, default --uri). */
    static Connection adminConnection() throws Exception {
        String uri = opt("declare-uri", opt("uri", "amqp://guest:guest@127.0.0.1:5672/%2F"));
        return factory(uri).newConnection("mirrorq-bench-admin");
    }

    static void declare(Channel ch, String queue) throws IOException {
        Map<String, Object> args = null;
        if (opts.containsKey("queue-type")) {
            args = new HashMap<>();
            args.put("x-queue-type", opt("queue-type", "classic"));
        }
        ch.queueDeclare(queue, true, false, false, args);
    }

    static String queueName(String prefix) {
        return opt("queue", "bench-" + prefix + "-" + UUID.randomUUID().toString().substring(0, 8));
    }

    static int bodySize() { return Math.max(MIN_BODY, optInt("size", 1024)); }

    /** The one block --payload compressible repeats (the same bytes as before issue 11). */
    static byte[] body(int size) {
        byte[] b = new byte[Math.max(MIN_BODY, size)];
        new Random(42).nextBytes(b);
        return b;
    }

    // ------------------------------------------------------------------ payloads

    static final int POOL_MAX_BYTES = 16 << 20;

    static String payload() {
        String p = opt("payload", "random");
        if (!p.equals("random") && !p.equals("compressible")) {
            throw new IllegalArgumentException("unknown --payload " + p + " (random or compressible)");
        }
        return p;
    }

    /** Distinct bodies per publisher for --payload random: --payload-pool, capped at 16 MiB, >= 2. */
    static int poolSize(int size) {
        if (payload().equals("compressible")) return 1;
        int want = Math.max(2, optInt("payload-pool", 256));
        return Math.max(2, Math.min(want, POOL_MAX_BYTES / Math.max(MIN_BODY, size)));
    }

    static void describePayload(Out out, int size) {
        out.put("payload", payload()).put("payload_pool", poolSize(size));
        if (payload().equals("random")) out.put("payload_seed", optLong("payload-seed", 42));
    }

    static long optLong(String k, long def) { return Long.parseLong(opt(k, String.valueOf(def))); }

    /** The bodies one publisher cycles through (its own arrays: it writes the id into them). */
    static Bodies bodies(int size, int publisher) {
        int n = Math.max(MIN_BODY, size);
        ByteBuffer[] pool = new ByteBuffer[poolSize(size)];
        if (payload().equals("compressible")) {
            pool[0] = ByteBuffer.wrap(body(n));
        } else {
            SplittableRandom rnd = new SplittableRandom(optLong("payload-seed", 42) + publisher);
            for (int i = 0; i < pool.length; i++) {
                byte[] b = new byte[n];
                rnd.nextBytes(b);
                pool[i] = ByteBuffer.wrap(b);
            }
        }
        return new Bodies(pool);
    }

    /**
     * One publisher's bodies, used round robin. The id (and in latency mode the timestamps)
     * is written into the chosen array in place: basicPublish copies the body into the
     * client's frame before it returns, so the array is free again at once and the hot path
     * allocates nothing. Not thread-safe: one instance per publishing thread.
     */
    static final class Bodies {
        final ByteBuffer[] pool;
        int next;

        Bodies(ByteBuffer[] pool) { this.pool = pool; }

        /** The next body of the pool, with `id` in bytes 0..7; publish its array(). */
        ByteBuffer next(long id) {
            ByteBuffer b = pool[next];
            next = next + 1 == pool.length ? 0 : next + 1;
            b.putLong(0, id);
            return b;
        }
    }

    static long msgId(int publisher, long seq) { return ((long) publisher << 32) | seq; }

    static AMQP.BasicProperties props() {
        return new AMQP.BasicProperties.Builder().deliveryMode(flag("transient") ? 1 : 2)
                .contentType("application/octet-stream").build();
    }

    static void latencies(Out out, String prefix, long[] ns, int n) {
        Arrays.sort(ns, 0, n);
        out.put(prefix + "_p50_ms", ms(pct(ns, n, 50)));
        out.put(prefix + "_p95_ms", ms(pct(ns, n, 95)));
        out.put(prefix + "_p99_ms", ms(pct(ns, n, 99)));
        out.put(prefix + "_max_ms", ms(n > 0 ? ns[n - 1] : 0));
    }

    static long pct(long[] s, int n, double p) {
        if (n == 0) return 0;
        int i = (int) Math.ceil(p / 100.0 * n) - 1;
        return s[Math.max(0, Math.min(n - 1, i))];
    }

    static double ms(long ns) { return Math.round(ns / 1e4) / 100.0; }

    static double rate(long n, long ns) { return ns <= 0 ? 0 : Math.round(n * 1e9 / ns * 10) / 10.0; }

    /** Messages per second over the first and the last 10% of sorted timestamps. */
    static void split(Out out, String prefix, long[] times, int n) {
        Arrays.sort(times, 0, n);
        int k = Math.max(2, n / 10);
        if (n < 4 || k > n) return;
        // k events spread over (k - 1) intervals
        double first = rate(k - 1, times[k - 1] - times[0]);
        double last = rate(k - 1, times[n - 1] - times[n - k]);
        out.put(prefix + "_rate_first10", first).put(prefix + "_rate_last10", last);
        out.put(prefix + "_split_ratio", first > 0 ? Math.round(last / first * 1000) / 1000.0 : 0);
    }

    /** Poll a passive declare until the queue holds `want` messages (or the stall timeout). */
    static int waitDepth(Channel ch, String queue, int want, long stallNs) throws Exception {
        long deadline = System.nanoTime() + stallNs;
        int n = ch.queueDeclarePassive(queue).getMessageCount();
        int last = n;
        while (n < want && System.nanoTime() < deadline) {
            Thread.sleep(20);
            n = ch.queueDeclarePassive(queue).getMessageCount();
            if (n != last) { last = n; deadline = System.nanoTime() + stallNs; }
        }
        return n;
    }

    // ------------------------------------------------------------------ confirms

    /**
     * One publisher: own connection and channel, streaming confirms, optional window
     * (window <= 0: unbounded, publish as fast as the socket takes it).
     */
    static class ConfirmPublisher implements Runnable {
        final int index; final int count; final String queue; final Bodies bodies; final int window;
        final long stallNs;
        final ConcurrentSkipListSet<Long> unconfirmed = new ConcurrentSkipListSet<>();
        final Semaphore permits;
        final long[] sentAt; final long[] confirmedAt;
        final AtomicInteger settled = new AtomicInteger();
        final AtomicInteger acks = new AtomicInteger(), nacks = new AtomicInteger(), doubles = new AtomicInteger();
        final AtomicInteger outstanding = new AtomicInteger();
        volatile int maxOutstanding;
        final CountDownLatch start;
        volatile String error;
        volatile long finishedAt;
        volatile long lastConfirmAt = System.nanoTime();
        volatile long lagNs;
        Connection conn;
        Channel chan;

        ConfirmPublisher(int index, int count, String queue, int size, int window, long stallNs,
                         CountDownLatch start) {
            this.index = index; this.count = count; this.queue = queue; this.bodies = bodies(size, index);
            this.window = window; this.stallNs = stallNs; this.start = start;
            permits = window > 0 ? new Semaphore(window) : null;
            sentAt = new long[count + 1];
            confirmedAt = new long[count + 1];
        }

        void open() throws Exception {
            conn = factory().newConnection("mirrorq-bench-confirms");
            Channel ch = conn.createChannel();
            ch.confirmSelect();
            ch.addConfirmListener(new ConfirmListener() {
                public void handleAck(long seq, boolean multiple) { settle(seq, multiple, true); }
                public void handleNack(long seq, boolean multiple) { settle(seq, multiple, false); }
            });
            chan = ch;
        }

        void settle(long seq, boolean multiple, boolean ack) {
            long now = System.nanoTime();
            lastConfirmAt = now;
            int released = 0;
            if (multiple) {
                NavigableSet<Long> head = unconfirmed.headSet(seq, true);
                Long s;
                boolean had = unconfirmed.contains(seq);
                while ((s = head.pollFirst()) != null) { record(s, ack, now); released++; }
                if (!had) doubles.incrementAndGet();
            } else if (unconfirmed.remove(seq)) {
                record(seq, ack, now);
                released++;
            } else {
                doubles.incrementAndGet();
            }
            if (released > 0) {
                outstanding.addAndGet(-released);
                if (permits != null) permits.release(released);
            }
        }

        void record(long seq, boolean ack, long now) {
            int i = (int) seq;
            if (i > 0 && i <= count) confirmedAt[i] = now;
            if (ack) acks.incrementAndGet(); else nacks.incrementAndGet();
            if (settled.incrementAndGet() == count) finishedAt = now;
        }

        public void run() {
            try {
                AMQP.BasicProperties p = props();
                start.await();
                for (int i = 1; i <= count; i++) {
                    if (permits != null && !permits.tryAcquire(stallNs, TimeUnit.NANOSECONDS)) {
                        throw new IllegalStateException("no confirm for " + stallNs / 1_000_000_000 + " s with "
                                + outstanding.get() + " outstanding");
                    }
                    long seq = chan.getNextPublishSeqNo();
                    if (seq != i) throw new IllegalStateException("publish seq " + seq + " != " + i);
                    byte[] body = bodies.next(msgId(index, seq)).array();
                    sentAt[i] = System.nanoTime();
                    unconfirmed.add(seq);
                    int o = outstanding.incrementAndGet();
                    if (o > maxOutstanding) maxOutstanding = o;
                    chan.basicPublish("", queue, p, body);
                }
                // wait for the last confirms: give up after stallNs without any confirm
                while (settled.get() < count) {
                    if (System.nanoTime() - lastConfirmAt > stallNs) {
                        throw new IllegalStateException(outstanding.get() + " publishes still unconfirmed after "
                                + stallNs / 1_000_000_000 + " s without a confirm");
                    }
                    if (!chan.isOpen()) throw new IllegalStateException("channel closed: " + chan.getCloseReason());
                    Thread.sleep(1);
                }
            } catch (Throwable t) {
                error = describe(t);
            }
        }
    }

    /** Untimed confirmed publishes to a throwaway non-durable queue: JIT-warm the client. */
    static void warmup(Out out, Channel ach, int size, int window, long stallNs) throws Exception {
        int warmup = optInt("warmup", 0);
        if (warmup <= 0) return;
        String wq = "bench-warmup-" + UUID.randomUUID().toString().substring(0, 8);
        ach.queueDeclare(wq, false, false, false, null);
        CountDownLatch go = new CountDownLatch(1);
        ConfirmPublisher w = new ConfirmPublisher(0, warmup, wq, size, window > 0 ? window : 1000, stallNs, go);
        w.open();
        go.countDown();
        w.run();
        try { w.conn.close(5000); } catch (Exception ignored) { }
        ach.queueDelete(wq);
        if (w.error != null) throw new IllegalStateException("warmup: " + w.error);
        out.put("warmup", warmup);
    }

    static void confirms(Out out) throws Exception {
        int count = optInt("count", 10_000);
        int size = bodySize();
        int window = optInt("window", 5_000);
        int pubs = optInt("publishers", 1);
        long stallNs = TimeUnit.SECONDS.toNanos(optInt("timeout", 120));
        String queue = queueName("confirms");
        out.put("queue", queue).put("count", count).put("size", size).put("window", window).put("publishers", pubs);
        out.put("persistent", !flag("transient"));
        // --publisher-offset P: publishers are numbered from P (ids and payload seeds), so
        // several runs into one queue (bench/backlog.py's slices) never repeat an id
        int pubBase = optInt("publisher-offset", 0);
        out.put("publisher_offset", pubBase);
        describePayload(out, size);

        Connection admin = adminConnection();
        try {
            Channel ach = admin.createChannel();
            declare(ach, queue);
            warmup(out, ach, size, window, stallNs);
            CountDownLatch start = new CountDownLatch(1);
            List<ConfirmPublisher> ps = new ArrayList<>();
            List<Thread> ts = new ArrayList<>();
            for (int i = 0; i < pubs; i++) {
                int share = count / pubs + (i < count % pubs ? 1 : 0);
                ConfirmPublisher p = new ConfirmPublisher(pubBase + i, share, queue, size, window, stallNs, start);
                p.open();
                ps.add(p);
                Thread t = new Thread(p, "publisher-" + i);
                t.start();
                ts.add(t);
            }
            long t0 = System.nanoTime();
            start.countDown();
            for (Thread t : ts) t.join();
            long t1 = System.nanoTime();
            long end = t0;
            int acks = 0, nacks = 0, doubles = 0, settled = 0, maxOut = 0;
            long[] lat = new long[count];
            long[] sent = new long[count];
            long[] conf = new long[count];
            int m = 0, ns = 0;
            long lastSent = t0;
            List<String> errors = new ArrayList<>();
            for (ConfirmPublisher p : ps) {
                acks += p.acks.get(); nacks += p.nacks.get(); doubles += p.doubles.get(); settled += p.settled.get();
                maxOut = Math.max(maxOut, p.maxOutstanding);
                end = Math.max(end, p.finishedAt == 0 ? t1 : p.finishedAt);
                for (int i = 1; i <= p.count; i++) {
                    if (p.sentAt[i] > 0) { sent[ns++] = p.sentAt[i]; lastSent = Math.max(lastSent, p.sentAt[i]); }
                    if (p.confirmedAt[i] > 0) { conf[m] = p.confirmedAt[i]; lat[m++] = p.confirmedAt[i] - p.sentAt[i]; }
                }
                if (p.error != null) errors.add(p.error);
                try { p.conn.close(5000); } catch (Exception ignored) { }
            }
            long elapsed = end - t0;
            out.put("elapsed_ms", ms(elapsed)).put("msg_per_s", rate(settled, elapsed));
            out.put("mb_per_s", Math.round(rate(settled, elapsed) * size / 1e4) / 100.0);
            out.put("publish_ms", ms(lastSent - t0)).put("publish_msg_per_s", rate(ns, lastSent - t0));
            out.put("acked", acks).put("nacked", nacks).put("double_confirms", doubles);
            out.put("max_outstanding", maxOut);
            latencies(out, "confirm", lat, m);
            split(out, "publish", sent, ns);
            split(out, "confirm", conf, m);
            List<String> problems = new ArrayList<>(errors);
            if (settled != count) problems.add("confirmed " + settled + " of " + count);
            if (doubles > 0) problems.add(doubles + " double confirms");
            if (nacks > 0) problems.add(nacks + " nacks");
            if (flag("check-depth") && errors.isEmpty()) {
                int depth = waitDepth(ach, queue, count, stallNs);
                out.put("queue_count", depth);
                if (depth != count) problems.add("queue holds " + depth + " after " + count + " confirms");
            }
            if (!flag("keep")) ach.queueDelete(queue);
            if (!problems.isEmpty()) out.put("error", String.join("; ", problems));
        } finally {
            try { admin.close(5000); } catch (Exception ignored) { }
        }
    }

    // ------------------------------------------------------------------ publish (no confirms)

    /** N threads, each on its own connection, publishing without confirms as fast as they can. */
    static void publish(Out out) throws Exception {
        int count = optInt("count", 100_000);
        int size = bodySize();
        int threads = Math.max(1, optInt("threads", 2));
        long stallNs = TimeUnit.SECONDS.toNanos(optInt("timeout", 120));
        String queue = queueName("publish");
        out.put("queue", queue).put("count", count).put("size", size).put("threads", threads);
        out.put("persistent", !flag("transient"));
        describePayload(out, size);
        Connection admin = adminConnection();
        try {
            Channel ach = admin.createChannel();
            declare(ach, queue);
            warmup(out, ach, size, 1000, stallNs);
            CountDownLatch start = new CountDownLatch(1);
            List<Connection> conns = new ArrayList<>();
            List<Thread> ts = new ArrayList<>();
            final long[] doneAt = new long[threads];
            final String[] errs = new String[threads];
            for (int i = 0; i < threads; i++) {
                final int idx = i;
                final int share = count / threads + (i < count % threads ? 1 : 0);
                Connection c = factory().newConnection("mirrorq-bench-publish");
                conns.add(c);
                final Channel ch = c.createChannel();
                final Bodies bodies = bodies(size, idx);
                Thread t = new Thread(() -> {
                    try {
                        AMQP.BasicProperties p = props();
                        start.await();
                        for (int s = 1; s <= share; s++) {
                            ch.basicPublish("", queue, p, bodies.next(msgId(idx, s)).array());
                        }
                        doneAt[idx] = System.nanoTime();
                    } catch (Throwable e) {
                        errs[idx] = describe(e);
                    }
                }, "publish-" + i);
                t.start();
                ts.add(t);
            }
            long t0 = System.nanoTime();
            start.countDown();
            for (Thread t : ts) t.join();
            long t1 = t0;
            List<String> problems = new ArrayList<>();
            for (int i = 0; i < threads; i++) {
                t1 = Math.max(t1, doneAt[i]);
                if (errs[i] != null) problems.add("thread " + i + ": " + errs[i]);
            }
            out.put("elapsed_ms", ms(t1 - t0)).put("msg_per_s", rate(count, t1 - t0));
            out.put("mb_per_s", Math.round(rate(count, t1 - t0) * size / 1e4) / 100.0);
            if (problems.isEmpty()) {
                int depth = waitDepth(ach, queue, count, stallNs);
                long t2 = System.nanoTime();
                out.put("queue_count", depth);
                out.put("enqueued_ms", ms(t2 - t0)).put("enqueued_msg_per_s", rate(depth, t2 - t0));
                if (depth != count) problems.add("queue holds " + depth + " after publishing " + count);
            }
            for (Connection c : conns) { try { c.close(5000); } catch (Exception ignored) { } }
            if (!flag("keep")) ach.queueDelete(queue);
            if (!problems.isEmpty()) out.put("error", String.join("; ", problems));
        } finally {
            try { admin.close(5000); } catch (Exception ignored) { }
        }
    }

    // ------------------------------------------------------------------ tx

    static void tx(Out out) throws Exception {
        int count = optInt("count", 2_000);
        int size = bodySize();
        String queue = queueName("tx");
        out.put("queue", queue).put("count", count).put("size", size).put("persistent", !flag("transient"));
        describePayload(out, size);
        Connection admin = adminConnection();
        Connection conn = factory().newConnection("mirrorq-bench-tx");
        try {
            Channel ach = admin.createChannel();
            declare(ach, queue);
            warmup(out, ach, size, 1000, TimeUnit.SECONDS.toNanos(optInt("timeout", 120)));
            Channel ch = conn.createChannel();
            ch.txSelect();
            Bodies bodies = bodies(size, 0);
            AMQP.BasicProperties p = props();
            long[] lat = new long[count];
            long t0 = System.nanoTime();
            for (int i = 0; i < count; i++) {
                long c0 = System.nanoTime();
                ch.basicPublish("", queue, p, bodies.next(msgId(0, i + 1)).array());
                ch.txCommit();
                lat[i] = System.nanoTime() - c0;
            }
            long elapsed = System.nanoTime() - t0;
            out.put("elapsed_ms", ms(elapsed)).put("msg_per_s", rate(count, elapsed));
            latencies(out, "commit", lat, count);
            int n = ach.queueDeclarePassive(queue).getMessageCount();
            if (n != count) n = waitDepth(ach, queue, count, TimeUnit.SECONDS.toNanos(5));
            out.put("queue_count", n);
            if (!flag("keep")) ach.queueDelete(queue);
            if (n != count) out.put("error", "queue holds " + n + " after " + count + " commits");
        } finally {
            try { conn.close(5000); } catch (Exception ignored) { }
            try { admin.close(5000); } catch (Exception ignored) { }
        }
    }

    // ------------------------------------------------------------------ consume

    static void consume(Out out) throws Exception {
        if (!opts.containsKey("queue")) throw new IllegalArgumentException("--mode consume needs --queue");
        String queue = opt("queue", "");
        final boolean autoAck = flag("auto-ack");
        int prefetch = optInt("prefetch", 1000);
        int ackEvery = Math.max(1, Math.min(optInt("ack-every", 100), Math.max(1, prefetch / 2)));
        long stallNs = TimeUnit.SECONDS.toNanos(optInt("timeout", 120));
        Connection conn = factory().newConnection("mirrorq-bench-consume");
        try {
            Channel ch = conn.createChannel();
            int ready = ch.queueDeclarePassive(queue).getMessageCount();
            final int count = opts.containsKey("count") ? optInt("count", 0) : ready;
            out.put("queue", queue).put("count", count).put("ready", ready).put("auto_ack", autoAck);
            if (!autoAck) {
                out.put("prefetch", prefetch).put("ack_every", ackEvery).put("ack_multiple", ackEvery > 1);
                ch.basicQos(prefetch);
            }
            final AtomicInteger got = new AtomicInteger();
            final AtomicLong bytes = new AtomicLong();
            final AtomicInteger redelivered = new AtomicInteger();
            final AtomicInteger duplicates = new AtomicInteger();
            // a bit per (publisher, sequence number): 10M ids cost 1.25 MB, not a HashSet<Long>'s ~600 MB
            final Map<Integer, BitSet> seen = new HashMap<>();
            final Verifier verifier = flag("verify") ? new Verifier() : null;
            final AtomicInteger damaged = new AtomicInteger();
            final int allowRedelivered = optInt("allow-redelivered", 0);
            final AtomicLong lastAt = new AtomicLong(System.nanoTime());
            final CountDownLatch done = new CountDownLatch(count == 0 ? 0 : 1);
            final int every = ackEvery;
            final boolean multiple = ackEvery > 1;
            long t0 = System.nanoTime();
            String tag = ch.basicConsume(queue, autoAck, new DefaultConsumer(ch) {
                @Override
                public void handleDelivery(String ct, Envelope env, AMQP.BasicProperties p, byte[] b)
                        throws IOException {
                    int c = got.incrementAndGet();
                    bytes.addAndGet(b.length);
                    if (env.isRedeliver()) redelivered.incrementAndGet();
                    if (b.length >= 8) {
                        long id = ByteBuffer.wrap(b).getLong(0);
                        int pub = (int) (id >>> 32), seq = (int) id;
                        BitSet bits = seen.computeIfAbsent(pub, k -> new BitSet());
                        if (seq < 0 || bits.get(seq)) duplicates.incrementAndGet(); else bits.set(seq);
                        if (verifier != null && !verifier.ok(pub, seq, b)) damaged.incrementAndGet();
                    } else if (verifier != null) {
                        damaged.incrementAndGet();
                    }
                    if (!autoAck && (c % every == 0 || c >= count)) {
                        getChannel().basicAck(env.getDeliveryTag(), multiple);
                    }
                    lastAt.set(System.nanoTime());
                    if (c == count) done.countDown();
                }
            });
            while (!done.await(200, TimeUnit.MILLISECONDS)) {
                if (System.nanoTime() - lastAt.get() > stallNs) break;
                if (!ch.isOpen()) break;
            }
            long elapsed = (got.get() >= count ? lastAt.get() : System.nanoTime()) - t0;
            if (ch.isOpen()) ch.basicCancel(tag);
            int consumed = got.get();
            out.put("consumed", consumed).put("redelivered", redelivered.get()).put("duplicates", duplicates.get());
            if (verifier != null) out.put("verified", true).put("damaged", damaged.get());
            out.put("elapsed_ms", ms(elapsed)).put("msg_per_s", rate(consumed, elapsed));
            List<String> problems = new ArrayList<>();
            if (consumed < count) problems.add("consumed " + consumed + " of " + count);
            if (consumed > count) problems.add("consumed " + consumed + ", more than " + count);
            if (duplicates.get() > 0) problems.add(duplicates.get() + " duplicate deliveries");
            if (redelivered.get() > allowRedelivered) problems.add(redelivered.get() + " redeliveries");
            if (damaged.get() > 0) problems.add(damaged.get() + " bodies differ from what was published");
            if (problems.isEmpty() && ch.isOpen()) {
                // the depth a (follower) node reports may trail the acks by a moment
                // (a probe's basic.get still unacked when the consume began is not in
                // `ready` but is consumed: RabbitMQ's quorum queue, 3 nodes)
                long expect = Math.max(0, ready - count);
                int left = ch.queueDeclarePassive(queue).getMessageCount();
                long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
                while (left != expect && System.nanoTime() < until) {
                    Thread.sleep(50);
                    left = ch.queueDeclarePassive(queue).getMessageCount();
                }
                out.put("remaining", left);
                if (left != expect) problems.add(left + " messages left, expected " + expect);
            }
            if (flag("delete") && ch.isOpen()) ch.queueDelete(queue);
            if (!problems.isEmpty()) out.put("error", String.join("; ", problems));
        } finally {
            try { conn.close(5000); } catch (Exception ignored) { }
        }
    }

    /**
     * --verify: every body must equal, byte for byte after its 8-byte id, the pool body its
     * publisher sent for that sequence number (confirms mode: body i of publisher p is
     * pool_p[(i - 1) % pool size], the pool rebuilt here from the same seed and options).
     * Pools are rebuilt per (publisher, size); the last few are kept (a backlog drains in
     * publish order, so one publisher at a time).
     */
    static final class Verifier {
        final Map<Long, ByteBuffer[]> pools = new java.util.LinkedHashMap<Long, ByteBuffer[]>(8, 0.75f, true) {
            @Override
            protected boolean removeEldestEntry(Map.Entry<Long, ByteBuffer[]> e) { return size() > 4; }
        };

        boolean ok(int publisher, int seq, byte[] b) {
            if (b.length < MIN_BODY || seq < 1) return false;
            long key = ((long) publisher << 32) | b.length;
            ByteBuffer[] pool = pools.get(key);
            if (pool == null) {
                pool = bodies(b.length, publisher).pool;
                pools.put(key, pool);
            }
            byte[] want = pool[(seq - 1) % pool.length].array();
            return Arrays.equals(b, 8, b.length, want, 8, want.length);
        }
    }

    // ------------------------------------------------------------------ latency

    /**
     * One producer publishing at a fixed rate (absolute schedule: message i is due at
     * t0 + i / rate; a late producer catches up without sleeping) with streaming confirms,
     * unbounded, and one consumer (own connection, manual acks, one per message); both in
     * this JVM. End-to-end latency = delivery time - publish time (System.nanoTime in the
     * body), over the messages published after the warm-up seconds.
     */
    static void latency(Out out) throws Exception {
        double rate = optDouble("rate", 2000);
        double duration = optDouble("duration", 10);
        double warmSec = optDouble("warmup-seconds", 2);
        int size = bodySize();
        int prefetch = optInt("prefetch", 100);
        long stallNs = TimeUnit.SECONDS.toNanos(optInt("timeout", 120));
        final int warmN = (int) Math.round(rate * warmSec);
        final int total = warmN + (int) Math.round(rate * duration);
        String queue = queueName("latency");
        out.put("queue", queue).put("rate", rate).put("duration_s", duration).put("warmup_s", warmSec)
           .put("count", total).put("measured", total - warmN).put("size", size).put("prefetch", prefetch)
           .put("persistent", !flag("transient"));
        describePayload(out, size);
        Connection admin = adminConnection();
        Connection cconn = null;
        try {
            Channel ach = admin.createChannel();
            declare(ach, queue);
            warmup(out, ach, size, 1000, stallNs);
            final long[] e2e = new long[total + 1];
            final long[] e2eSched = new long[total + 1];
            final AtomicInteger got = new AtomicInteger();
            final AtomicInteger duplicates = new AtomicInteger();
            final AtomicInteger redelivered = new AtomicInteger();
            final AtomicLong lastAt = new AtomicLong(System.nanoTime());
            final CountDownLatch done = new CountDownLatch(1);
            cconn = factory().newConnection("mirrorq-bench-latency-consumer");
            Channel cch = cconn.createChannel();
            cch.basicQos(prefetch);
            String tag = cch.basicConsume(queue, false, new DefaultConsumer(cch) {
                @Override
                public void handleDelivery(String ct, Envelope env, AMQP.BasicProperties p, byte[] b)
                        throws IOException {
                    long now = System.nanoTime();
                    ByteBuffer bb = ByteBuffer.wrap(b);
                    long id = bb.getLong(0);
                    int seq = (int) (id & 0xffffffffL);
                    if (env.isRedeliver()) redelivered.incrementAndGet();
                    if (seq >= 1 && seq <= total) {
                        if (e2e[seq] != 0) duplicates.incrementAndGet();
                        e2e[seq] = Math.max(1, now - bb.getLong(8));
                        e2eSched[seq] = Math.max(1, now - bb.getLong(16));
                    }
                    getChannel().basicAck(env.getDeliveryTag(), false);
                    lastAt.set(now);
                    if (got.incrementAndGet() == total) done.countDown();
                }
            });
            CountDownLatch start = new CountDownLatch(1);
            ConfirmPublisher pub = new ConfirmPublisher(0, total, queue, size, 0, stallNs, start) {
                @Override
                public void run() {
                    try {
                        AMQP.BasicProperties p = props();
                        double interval = 1e9 / rate;
                        long t0 = System.nanoTime();
                        long maxLag = 0;
                        for (int i = 1; i <= count; i++) {
                            long due = t0 + (long) ((i - 1) * interval);
                            long now;
                            while ((now = System.nanoTime()) < due) LockSupport.parkNanos(due - now);
                            maxLag = Math.max(maxLag, now - due);
                            long seq = chan.getNextPublishSeqNo();
                            if (seq != i) throw new IllegalStateException("publish seq " + seq + " != " + i);
                            ByteBuffer bb = bodies.next(msgId(0, seq));
                            long ts = System.nanoTime();
                            bb.putLong(8, ts);
                            bb.putLong(16, due);
                            sentAt[i] = ts;
                            unconfirmed.add(seq);
                            outstanding.incrementAndGet();
                            chan.basicPublish("", queue, p, bb.array());
                            if (!chan.isOpen()) throw new IllegalStateException("channel closed");
                        }
                        lagNs = maxLag;
                        while (settled.get() < count) {
                            if (System.nanoTime() - lastConfirmAt > stallNs) {
                                throw new IllegalStateException(outstanding.get() + " unconfirmed after "
                                        + stallNs / 1_000_000_000 + " s without a confirm");
                            }
                            Thread.sleep(1);
                        }
                    } catch (Throwable t) {
                        error = describe(t);
                    }
                }
            };
            pub.open();
            Thread pt = new Thread(pub, "latency-producer");
            pt.start();
            start.countDown();
            pt.join();
            while (pub.error == null && !done.await(200, TimeUnit.MILLISECONDS)) {
                if (System.nanoTime() - lastAt.get() > stallNs) break;
                if (!cch.isOpen()) break;
            }
            if (cch.isOpen()) cch.basicCancel(tag);
            try { pub.conn.close(5000); } catch (Exception ignored) { }
            // measured window: messages warmN+1 .. total
            int n = 0;
            long[] lat = new long[total];
            long[] latS = new long[total];
            long[] clat = new long[total];
            int cn = 0;
            for (int i = warmN + 1; i <= total; i++) {
                if (e2e[i] > 0) { lat[n] = e2e[i]; latS[n++] = e2eSched[i]; }
                if (pub.confirmedAt[i] > 0) clat[cn++] = pub.confirmedAt[i] - pub.sentAt[i];
            }
            long first = pub.sentAt[Math.min(total, warmN + 1)], last = pub.sentAt[total];
            int measured = total - warmN;
            out.put("publish_msg_per_s", rate(Math.max(0, measured - 1), last - first));
            out.put("msg_per_s", rate(Math.max(0, measured - 1), last - first));
            out.put("max_schedule_lag_ms", ms(pub.lagNs));
            latencies(out, "e2e", lat, n);
            Arrays.sort(latS, 0, n);
            out.put("e2e_sched_p50_ms", ms(pct(latS, n, 50))).put("e2e_sched_p99_ms", ms(pct(latS, n, 99)));
            latencies(out, "confirm", clat, cn);
            out.put("consumed", got.get()).put("duplicates", duplicates.get()).put("redelivered", redelivered.get());
            out.put("acked", pub.acks.get()).put("nacked", pub.nacks.get()).put("double_confirms", pub.doubles.get());
            List<String> problems = new ArrayList<>();
            if (pub.error != null) problems.add(pub.error);
            if (got.get() != total) problems.add("consumed " + got.get() + " of " + total);
            if (duplicates.get() > 0) problems.add(duplicates.get() + " duplicate deliveries");
            if (pub.settled.get() != total) problems.add("confirmed " + pub.settled.get() + " of " + total);
            if (pub.doubles.get() > 0) problems.add(pub.doubles.get() + " double confirms");
            if (pub.nacks.get() > 0) problems.add(pub.nacks.get() + " nacks");
            if (n != measured) problems.add("measured " + n + " latencies of " + measured);
            if (!flag("keep")) ach.queueDelete(queue);
            if (!problems.isEmpty()) out.put("error", String.join("; ", problems));
        } finally {
            if (cconn != null) { try { cconn.close(5000); } catch (Exception ignored) { } }
            try { admin.close(5000); } catch (Exception ignored) { }
        }
    }

    // ------------------------------------------------------------------ output

    static final class Out {
        final Map<String, Object> fields = new java.util.LinkedHashMap<>();

        Out put(String k, Object v) { fields.put(k, v); return this; }

        String json() {
            StringBuilder sb = new StringBuilder("{");
            boolean first = true;
            for (Map.Entry<String, Object> e : fields.entrySet()) {
                if (!first) sb.append(',');
                first = false;
                sb.append(q(e.getKey())).append(':');
                Object v = e.getValue();
                if (v instanceof Number || v instanceof Boolean) sb.append(v);
                else sb.append(q(String.valueOf(v)));
            }
            return sb.append('}').toString();
        }

        static String q(String s) {
            StringBuilder sb = new StringBuilder("\"");
            for (char c : s.toCharArray()) {
                if (c == '"' || c == '\\') sb.append('\\').append(c);
                else if (c < 0x20) sb.append(String.format("\\u%04x", (int) c));
                else sb.append(c);
            }
            return sb.append('"').toString();
        }
    }
}
