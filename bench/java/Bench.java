import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmListener;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Envelope;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.NavigableSet;
import java.util.Random;
import java.util.UUID;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * mirrorq load generator (RabbitMQ Java client). One JSON line on stdout.
 *
 *   Bench --uri URI --mode confirms --count 10000 --size 1024 --window 5000 --publishers 1
 *   Bench --uri URI --mode tx       --count 2000  --size 1024
 *   Bench --uri URI --mode consume  --queue Q [--count N] --prefetch 1000 --ack-every 100
 *
 * Common: --queue NAME (default: a fresh durable queue), --keep (do not delete the
 * queue afterwards; default for confirms/tx is to delete unless --keep),
 * --warmup N (confirms: first publish N untimed messages to a throwaway queue),
 * --timeout SECONDS (stall timeout, default 120), --transient (non-persistent).
 * Exit status 0 when every message was confirmed/committed/consumed, else 1.
 */
public final class Bench {
    static final Map<String, String> opts = new HashMap<>();

    static String opt(String k, String def) { return opts.getOrDefault(k, def); }
    static int optInt(String k, int def) { return Integer.parseInt(opt(k, String.valueOf(def))); }
    static boolean flag(String k) { return opts.containsKey(k); }

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
                case "tx": tx(out); break;
                case "consume": consume(out); break;
                default: throw new IllegalArgumentException("unknown --mode " + mode);
            }
        } catch (Throwable t) {
            out.put("error", describe(t));
        }
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

    static ConnectionFactory factory() throws Exception {
        ConnectionFactory cf = new ConnectionFactory();
        cf.setUri(opt("uri", "amqp://guest:guest@127.0.0.1:5672/%2F"));
        if (cf.getVirtualHost() == null || cf.getVirtualHost().isEmpty()) cf.setVirtualHost("/");
        cf.setAutomaticRecoveryEnabled(false);
        cf.setConnectionTimeout(10_000);
        cf.setRequestedHeartbeat(60);
        return cf;
    }

    static String queueName(String prefix) {
        return opt("queue", "bench-" + prefix + "-" + UUID.randomUUID().toString().substring(0, 8));
    }

    static byte[] body(int size) {
        byte[] b = new byte[size];
        new Random(42).nextBytes(b);
        return b;
    }

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

    // ------------------------------------------------------------------ confirms

    /** One publisher: own connection and channel, streaming confirms, bounded window. */
    static final class ConfirmPublisher implements Runnable {
        final int count; final String queue; final byte[] body; final int window; final long stallNs;
        final ConcurrentSkipListSet<Long> unconfirmed = new ConcurrentSkipListSet<>();
        final Semaphore permits;
        final long[] sentAt; final long[] lat;
        final AtomicInteger settled = new AtomicInteger();
        final AtomicInteger acks = new AtomicInteger(), nacks = new AtomicInteger(), doubles = new AtomicInteger();
        final CountDownLatch start;
        volatile String error;
        volatile long finishedAt;
        Connection conn;

        ConfirmPublisher(int count, String queue, byte[] body, int window, long stallNs, CountDownLatch start) {
            this.count = count; this.queue = queue; this.body = body; this.window = window;
            this.stallNs = stallNs; this.start = start;
            permits = new Semaphore(window);
            sentAt = new long[count + 1];
            lat = new long[count + 1];
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

        Channel chan;

        void settle(long seq, boolean multiple, boolean ack) {
            long now = System.nanoTime();
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
            if (released > 0) permits.release(released);
        }

        void record(long seq, boolean ack, long now) {
            int i = (int) seq;
            if (i > 0 && i <= count) lat[i] = now - sentAt[i];
            if (ack) acks.incrementAndGet(); else nacks.incrementAndGet();
            if (settled.incrementAndGet() == count) finishedAt = now;
        }

        public void run() {
            try {
                AMQP.BasicProperties p = props();
                start.await();
                for (int i = 1; i <= count; i++) {
                    if (!permits.tryAcquire(stallNs, TimeUnit.NANOSECONDS)) {
                        throw new IllegalStateException("no confirm for " + stallNs / 1_000_000_000 + " s with "
                                + unconfirmed.size() + " outstanding");
                    }
                    long seq = chan.getNextPublishSeqNo();
                    sentAt[(int) seq] = System.nanoTime();
                    unconfirmed.add(seq);
                    chan.basicPublish("", queue, p, body);
                }
                if (!permits.tryAcquire(window, stallNs, TimeUnit.NANOSECONDS)) {
                    throw new IllegalStateException(unconfirmed.size() + " publishes still unconfirmed after "
                            + stallNs / 1_000_000_000 + " s");
                }
            } catch (Throwable t) {
                error = describe(t);
            }
        }
    }

    static void confirms(Out out) throws Exception {
        int count = optInt("count", 10_000);
        int size = optInt("size", 1024);
        int window = optInt("window", 5_000);
        int pubs = optInt("publishers", 1);
        long stallNs = TimeUnit.SECONDS.toNanos(optInt("timeout", 120));
        String queue = queueName("confirms");
        out.put("queue", queue).put("count", count).put("size", size).put("window", window).put("publishers", pubs);
        out.put("persistent", !flag("transient"));

        Connection admin = factory().newConnection("mirrorq-bench-admin");
        try {
            Channel ach = admin.createChannel();
            ach.queueDeclare(queue, true, false, false, null);
            byte[] body = body(size);
            int warmup = optInt("warmup", 0);
            if (warmup > 0) {
                // JIT-warm the client on a throwaway queue so both brokers see a warm JVM
                String wq = "bench-warmup-" + UUID.randomUUID().toString().substring(0, 8);
                ach.queueDeclare(wq, false, false, false, null);
                CountDownLatch go = new CountDownLatch(1);
                ConfirmPublisher w = new ConfirmPublisher(warmup, wq, body, window, stallNs, go);
                w.open();
                go.countDown();
                w.run();
                try { w.conn.close(5000); } catch (Exception ignored) { }
                ach.queueDelete(wq);
                if (w.error != null) throw new IllegalStateException("warmup: " + w.error);
                out.put("warmup", warmup);
            }
            CountDownLatch start = new CountDownLatch(1);
            List<ConfirmPublisher> ps = new ArrayList<>();
            List<Thread> ts = new ArrayList<>();
            for (int i = 0; i < pubs; i++) {
                int share = count / pubs + (i < count % pubs ? 1 : 0);
                ConfirmPublisher p = new ConfirmPublisher(share, queue, body, window, stallNs, start);
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
            int acks = 0, nacks = 0, doubles = 0, settled = 0;
            long[] all = new long[count];
            int m = 0;
            List<String> errors = new ArrayList<>();
            for (ConfirmPublisher p : ps) {
                acks += p.acks.get(); nacks += p.nacks.get(); doubles += p.doubles.get(); settled += p.settled.get();
                end = Math.max(end, p.finishedAt == 0 ? t1 : p.finishedAt);
                for (int i = 1; i <= p.count; i++) if (p.lat[i] > 0) all[m++] = p.lat[i];
                if (p.error != null) errors.add(p.error);
                try { p.conn.close(5000); } catch (Exception ignored) { }
            }
            long elapsed = end - t0;
            out.put("elapsed_ms", ms(elapsed)).put("msg_per_s", rate(settled, elapsed));
            out.put("mb_per_s", Math.round(rate(settled, elapsed) * size / 1e4) / 100.0);
            out.put("acked", acks).put("nacked", nacks).put("double_confirms", doubles);
            latencies(out, "confirm", all, m);
            if (!flag("keep")) ach.queueDelete(queue);
            if (!errors.isEmpty()) out.put("error", String.join("; ", errors));
            else if (settled != count || doubles > 0) {
                out.put("error", "confirmed " + settled + " of " + count + ", " + doubles + " double confirms");
            }
        } finally {
            try { admin.close(5000); } catch (Exception ignored) { }
        }
    }

    // ------------------------------------------------------------------ tx

    static void tx(Out out) throws Exception {
        int count = optInt("count", 2_000);
        int size = optInt("size", 1024);
        String queue = queueName("tx");
        out.put("queue", queue).put("count", count).put("size", size).put("persistent", !flag("transient"));
        Connection conn = factory().newConnection("mirrorq-bench-tx");
        try {
            Channel ch = conn.createChannel();
            ch.queueDeclare(queue, true, false, false, null);
            ch.txSelect();
            byte[] body = body(size);
            AMQP.BasicProperties p = props();
            long[] lat = new long[count];
            long t0 = System.nanoTime();
            for (int i = 0; i < count; i++) {
                long c0 = System.nanoTime();
                ch.basicPublish("", queue, p, body);
                ch.txCommit();
                lat[i] = System.nanoTime() - c0;
            }
            long elapsed = System.nanoTime() - t0;
            out.put("elapsed_ms", ms(elapsed)).put("msg_per_s", rate(count, elapsed));
            latencies(out, "commit", lat, count);
            Channel probe = conn.createChannel();
            int n = probe.queueDeclarePassive(queue).getMessageCount();
            out.put("queue_count", n);
            if (!flag("keep")) probe.queueDelete(queue);
            if (n != count) out.put("error", "queue holds " + n + " after " + count + " commits");
        } finally {
            try { conn.close(5000); } catch (Exception ignored) { }
        }
    }

    // ------------------------------------------------------------------ consume

    static void consume(Out out) throws Exception {
        if (!opts.containsKey("queue")) throw new IllegalArgumentException("--mode consume needs --queue");
        String queue = opt("queue", "");
        int prefetch = optInt("prefetch", 1000);
        int ackEvery = Math.max(1, Math.min(optInt("ack-every", 100), Math.max(1, prefetch / 2)));
        long stallNs = TimeUnit.SECONDS.toNanos(optInt("timeout", 120));
        Connection conn = factory().newConnection("mirrorq-bench-consume");
        try {
            Channel ch = conn.createChannel();
            int ready = ch.queueDeclarePassive(queue).getMessageCount();
            final int count = opts.containsKey("count") ? optInt("count", 0) : ready;
            out.put("queue", queue).put("count", count).put("ready", ready).put("prefetch", prefetch)
               .put("ack_every", ackEvery);
            ch.basicQos(prefetch);
            final AtomicInteger got = new AtomicInteger();
            final AtomicLong bytes = new AtomicLong();
            final AtomicInteger redelivered = new AtomicInteger();
            final AtomicLong lastAt = new AtomicLong(System.nanoTime());
            final CountDownLatch done = new CountDownLatch(count == 0 ? 0 : 1);
            final int every = ackEvery;
            long t0 = System.nanoTime();
            String tag = ch.basicConsume(queue, false, new DefaultConsumer(ch) {
                @Override
                public void handleDelivery(String ct, Envelope env, AMQP.BasicProperties p, byte[] b)
                        throws IOException {
                    int c = got.incrementAndGet();
                    bytes.addAndGet(b.length);
                    if (env.isRedeliver()) redelivered.incrementAndGet();
                    if (c % every == 0 || c >= count) getChannel().basicAck(env.getDeliveryTag(), true);
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
            out.put("consumed", got.get()).put("redelivered", redelivered.get());
            out.put("elapsed_ms", ms(elapsed)).put("msg_per_s", rate(got.get(), elapsed));
            if (flag("delete")) ch.queueDelete(queue);
            if (got.get() < count) out.put("error", "consumed " + got.get() + " of " + count);
        } finally {
            try { conn.close(5000); } catch (Exception ignored) { }
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
