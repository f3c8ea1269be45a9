import java.nio.file.Paths;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import qupath.lib.io.PathIO;
import qupath.lib.objects.PathObject;
import qupath.lib.roi.EllipseROI;

/** Reads GeoJSON files with QuPath's own reader (PathIO.readObjects, what File > Import objects
 * from file... calls) and says what QuPath made of them. */
public class ReadCyto {
    public static void main(String[] args) throws Exception {
        for (String a : args) {
            List<PathObject> objs;
            try {
                objs = PathIO.readObjects(Paths.get(a));
            } catch (Exception e) {
                System.out.println(a + ": QuPath cannot read it: " + e);
                continue;
            }
            int det = 0, ell = 0;
            Set<String> names = new TreeSet<>();
            Map<String, Integer> classes = new TreeMap<>();
            for (PathObject o : objs) {
                if (o.isDetection()) det++;
                if (o.getROI() instanceof EllipseROI) ell++;
                if (o.getPathClass() != null)
                    classes.merge(o.getPathClass() + " #" + Integer.toHexString(o.getPathClass().getColor() & 0xffffff), 1, Integer::sum);
                names.addAll(o.getMeasurementList().getMeasurementNames());
            }
            System.out.println(a + ": objects=" + objs.size() + " detections=" + det + " ellipse ROIs=" + ell + " classes=" + classes);
            System.out.println("  measurements: " + names);
            PathObject first = objs.get(0);
            System.out.println("  first: " + first.getName() + " " + first.getROI() + " " + first.getMeasurementList().asMap());
        }
    }
}
