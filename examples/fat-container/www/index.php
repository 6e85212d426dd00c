<?php
// One value from each ConfigMap: the pool's GREETING (php-fpm) and the
// site's SITE (nginx), so an edit of either shows here once applied.
header('Content-Type: text/plain');
echo getenv('GREETING'), ' | ', $_SERVER['SITE'] ?? '', "\n";
