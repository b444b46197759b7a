import com.rabbitmq.client.ConnectionFactory;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Shared helpers for the mirrorq Java client checks: connection setup from an
 * AMQP URI and a tiny JSON result line (no external JSON library needed).
 */
final class JavaTestUtil {
    private JavaTestUtil() {}

    static ConnectionFactory factory(String uri) throws Exception {
        ConnectionFactory cf = new ConnectionFactory();
        cf.setUri(uri);
        // "amqp://h:p/" yields the empty vhost in the Java client; RabbitMQ's
        // convention (and the other clients') is the default vhost "/".
        if (cf.getVirtualHost() == null || cf.getVirtualHost().isEmpty()) {
            cf.setVirtualHost("/");
        }
        cf.setAutomaticRecoveryEnabled(false);
        cf.setTopologyRecoveryEnabled(false);
        cf.setConnectionTimeout(10_000);
        cf.setHandshakeTimeout(10_000);
        cf.setRequestedHeartbeat(30);
        return cf;
    }

    static long percentile(long[] sorted, int n, double p) {
        if (n == 0) return 0;
        int idx = (int) Math.ceil(p / 100.0 * n) - 1;
        if (idx < 0) idx = 0;
        if (idx >= n) idx = n - 1;
        return sorted[idx];
    }

    /** Ordered result map rendered as a single JSON line. */
    static final class Result {
        final Map<String, Object> fields = new LinkedHashMap<>();
        final List<String> violations = new ArrayList<>();

        Result(String program) { fields.put("program", program); }

        Result put(String k, Object v) { fields.put(k, v); return this; }

        synchronized void violation(String msg) {
            if (violations.size() < 50) violations.add(msg);
            else if (violations.size() == 50) violations.add("... (more violations suppressed)");
        }

        synchronized boolean ok() { return violations.isEmpty() && !fields.containsKey("error"); }

        synchronized String json() {
            StringBuilder sb = new StringBuilder("{");
            for (Map.Entry<String, Object> e : fields.entrySet()) {
                sb.append(quote(e.getKey())).append(':').append(value(e.getValue())).append(',');
            }
            sb.append("\"violations\":[");
            for (int i = 0; i < violations.size(); i++) {
                if (i > 0) sb.append(',');
                sb.append(quote(violations.get(i)));
            }
            sb.append("],\"ok\":").append(ok()).append('}');
            return sb.toString();
        }

        /** Print the JSON line and exit: 0 if no violation/error, 1 otherwise. */
        void finish() {
            System.out.println(json());
            System.out.flush();
            System.exit(ok() ? 0 : 1);
        }

        void fail(Throwable t) {
            StringBuilder sb = new StringBuilder();
            for (Throwable c = t; c != null && sb.length() < 2000; c = c.getCause()) {
                if (sb.length() > 0) sb.append(" <- ");
                sb.append(c.getClass().getName()).append(": ").append(c.getMessage());
                if (c.getCause() == c) break;
            }
            put("error", sb.toString());
            finish();
        }

        private static String value(Object v) {
            if (v == null) return "null";
            if (v instanceof Number || v instanceof Boolean) {
                if (v instanceof Double && (((Double) v).isNaN() || ((Double) v).isInfinite())) return "null";
                return v.toString();
            }
            return quote(v.toString());
        }

        static String quote(String s) {
            StringBuilder sb = new StringBuilder("\"");
            for (char c : s.toCharArray()) {
                switch (c) {
                    case '"': sb.append("\\\""); break;
                    case '\\': sb.append("\\\\"); break;
                    case '\n': sb.append("\\n"); break;
                    case '\r': sb.append("\\r"); break;
                    case '\t': sb.append("\\t"); break;
                    default:
                        if (c < 0x20) sb.append(String.format("\\u%04x", (int) c));
                        else sb.append(c);
                }
            }
            return sb.append('"').toString();
        }
    }

    static double round2(double d) { return Math.round(d * 100.0) / 100.0; }
}
