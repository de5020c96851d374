// A member instance on orbit.java's pcgroups library, as a Java service would run one:
//   CgJavaMember static|elastic SERVER STREAM GROUP MEMBER SECONDS
// consumes for SECONDS (or until 3 s pass without a message once one came), acknowledges each
// message, and prints each one's subject as the server delivered it, then "count N".
import io.nats.client.Connection;
import io.nats.client.Nats;
import io.nats.client.api.ConsumerConfiguration;
import io.synadia.pcg.ConsumerGroupConsumeContext;
import io.synadia.pcg.ElasticConsumerGroup;
import io.synadia.pcg.StaticConsumerGroup;

import java.time.Duration;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

public class CgJavaMember {
    public static void main(String[] args) throws Exception {
        String kind = args[0], server = args[1], stream = args[2], group = args[3], member = args[4];
        long seconds = Long.parseLong(args[5]);
        AtomicInteger count = new AtomicInteger();
        AtomicLong last = new AtomicLong(0);
        try (Connection nc = Nats.connect(server)) {
            ConsumerConfiguration cc = ConsumerConfiguration.builder().ackWait(Duration.ofSeconds(5)).build();
            ConsumerGroupConsumeContext ctx = "static".equals(kind)
                ? StaticConsumerGroup.consume(nc, stream, group, member, m -> handle(m, count, last), cc)
                : ElasticConsumerGroup.consume(nc, stream, group, member, m -> handle(m, count, last), cc);
            long deadline = System.currentTimeMillis() + seconds * 1000;
            while (System.currentTimeMillis() < deadline) {
                long at = last.get();
                if (at > 0 && System.currentTimeMillis() - at > 3000) break;
                Thread.sleep(100);
            }
            ctx.stop();
        }
        System.out.println("count " + count.get());
    }

    private static void handle(io.synadia.pcg.ConsumerGroupMsg m, AtomicInteger count, AtomicLong last) {
        try {
            m.ack();
        } catch (Exception e) {
            throw new RuntimeException(e);
        }
        synchronized (System.out) {
            System.out.println("msg " + m.getRawSubject());
        }
        count.incrementAndGet();
        last.set(System.currentTimeMillis());
    }
}
