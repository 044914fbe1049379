package rocketspark.test;

import java.lang.reflect.Field;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import org.apache.rocketmq.store.ha.DefaultHAService;

/**
 * DefaultHAService with the acceptor of slave connections bound to loopback.
 *
 * <p>RocketMQ 5.3's HA acceptor (haListenPort) binds all interfaces, and no option makes it
 * bind loopback. The test brokers get this HA service instead: the store loads its HA service
 * through ServiceProvider (META-INF/service/org.apache.rocketmq.store.ha.HAService, looked up
 * on the context class loader), so this class and that file, first on the broker's classpath,
 * replace DefaultHAService. Before the acceptor binds, its listen address (a private field
 * set from haListenPort alone) is replaced by 127.0.0.1 and the same port; everything else
 * (the acceptor, group transfer, connection state notification, a slave's HA client) starts
 * as in DefaultHAService.start(), so a slave replicates from its master over loopback.
 */
public class LoopbackOnlyHAService extends DefaultHAService {
    @Override
    public void start() throws Exception {
        Field listen = findField(this.acceptSocketService.getClass(), "socketAddressListen");
        listen.setAccessible(true);
        InetSocketAddress wildcard = (InetSocketAddress) listen.get(this.acceptSocketService);
        listen.set(
            this.acceptSocketService,
            new InetSocketAddress(InetAddress.getLoopbackAddress(), wildcard.getPort()));
        super.start();
    }

    private static Field findField(Class<?> type, String name) throws NoSuchFieldException {
        for (Class<?> c = type; c != null; c = c.getSuperclass()) {
            try {
                return c.getDeclaredField(name);
            } catch (NoSuchFieldException e) {
                // declared further up
            }
        }
        throw new NoSuchFieldException(name + " in " + type.getName() + " or its superclasses");
    }
}
