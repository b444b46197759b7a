import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.MessageProperties;

import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.UUID;

/**
 * S24 (and the S21 baseline): publish N persistent messages to a durable queue
 * with tx.commit after every one, timing it; check the queue then holds exactly
 * N; check tx.rollback discards uncommitted publishes and an uncommitted ack;
 * drain with basic.get to check every message is there exactly once.
 *
 * usage: TxPerMessage URI [count=2000] [size=1024]
 */
public final class TxPerMessage {
    public static void main(String[] args) {
        JavaTestUtil.Result r = new JavaTestUtil.Result("TxPerMessage");
        try {
            run(args, r);
            r.finish();
        } catch (Throwable t) {
            r.fail(t);
        }
    }

    static void run(String[] args, JavaTestUtil.Result r) throws Exception {
        String uri = args[0];
        int n = args.length > 1 ? Integer.parseInt(args[1]) : 2_000;
        int size = args.length > 2 ? Integer.parseInt(args[2]) : 1024;
        r.put("messages", n).put("size", size);

        Connection conn = JavaTestUtil.factory(uri).newConnection("mirrorq-java-tx");
        try {
            Channel ch = conn.createChannel();
            String queue = "java-tx-" + UUID.randomUUID().toString().substring(0, 12);
            ch.queueDeclare(queue, true, false, false, null);
            r.put("queue", queue);
            ch.txSelect();

            byte[] body = new byte[size];
            Arrays.fill(body, (byte) 't');
            long[] commitNs = new long[n];
            long t0 = System.nanoTime();
            for (int i = 1; i <= n; i++) {
                ByteBuffer.wrap(body).putLong(0, i);
                long c0 = System.nanoTime();
                ch.basicPublish("", queue, MessageProperties.PERSISTENT_BASIC, body);
                ch.txCommit();
                commitNs[i - 1] = System.nanoTime() - c0;
            }
            double elapsedMs = (System.nanoTime() - t0) / 1e6;
            r.put("elapsed_ms", JavaTestUtil.round2(elapsedMs));
            r.put("msg_per_s", JavaTestUtil.round2(n / (elapsedMs / 1000.0)));
            Arrays.sort(commitNs);
            r.put("commit_p50_ms", JavaTestUtil.round2(JavaTestUtil.percentile(commitNs, n, 50) / 1e6));
            r.put("commit_p99_ms", JavaTestUtil.round2(JavaTestUtil.percentile(commitNs, n, 99) / 1e6));

            // A separate, non-transactional channel sees committed state only.
            Channel probe = conn.createChannel();
            int count = probe.queueDeclarePassive(queue).getMessageCount();
            r.put("queue_count", count);
            if (count != n) r.violation("queue holds " + count + " after " + n + " commits, expected " + n);

            // Uncommitted publishes must vanish on rollback.
            for (int i = 0; i < 5; i++) {
                ByteBuffer.wrap(body).putLong(0, -1L);
                ch.basicPublish("", queue, MessageProperties.PERSISTENT_BASIC, body);
            }
            int before = probe.queueDeclarePassive(queue).getMessageCount();
            if (before != n) r.violation("uncommitted publishes visible before commit: count " + before);
            ch.txRollback();
            int after = probe.queueDeclarePassive(queue).getMessageCount();
            r.put("count_after_rollback", after);
            if (after != n) r.violation("queue holds " + after + " after tx.rollback of 5 publishes, expected " + n);

            // Drain with basic.get + manual ack on the probe channel; every id exactly once.
            int[] seen = new int[n + 1];
            int got = 0;
            long lastTag = 0;
            long g0 = System.nanoTime();
            GetResponse resp;
            while ((resp = probe.basicGet(queue, false)) != null) {
                byte[] b = resp.getBody();
                long id = b.length >= 8 ? ByteBuffer.wrap(b).getLong(0) : -2;
                if (id < 1 || id > n) r.violation("got a message with id " + id + " (rolled back or corrupt)");
                else if (++seen[(int) id] > 1) r.violation("message " + id + " present more than once");
                if (resp.getEnvelope().isRedeliver()) r.violation("message " + id + " redelivered=true on first get");
                got++;
                lastTag = resp.getEnvelope().getDeliveryTag();
                if (got % 100 == 0) { probe.basicAck(lastTag, true); lastTag = 0; }
                if (got > n + 10) break;
            }
            if (lastTag != 0) probe.basicAck(lastTag, true);
            r.put("drained", got);
            r.put("drain_ms", JavaTestUtil.round2((System.nanoTime() - g0) / 1e6));
            int missing = 0;
            for (int i = 1; i <= n; i++) if (seen[i] == 0) missing++;
            r.put("missing", missing);
            if (missing > 0) r.violation(missing + " committed messages missing");
            ch.queueDelete(queue);
        } finally {
            try { conn.close(5000); } catch (Exception ignored) { }
        }
    }
}
